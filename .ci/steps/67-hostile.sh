#!/usr/bin/env bash
# The hostile-client suite (docs/security.md): first the cargo tests that play a hostile client or peer on
# 127.0.0.1 (every malformed hello and frame, silent and garbage floods, spoofed claimed addresses, a
# replayed handshake, lying senders, a peer that does not accept, abandoned connects), each followed by
# a real connector completing on the same listener; then tests/netns/hostile.sh: `switchless bench`
# between two namespaces completing verified transfers while a client in a third attacks every port
# rank 0 listens on. Needs root and iproute2 for the second part. About a minute once built.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" -eq 0 ] || { echo "67-hostile: needs root to create network namespaces" >&2; exit 1; }

# tests <binary> <name>...: the named tests of one test binary, exact names (a renamed test fails here).
tests() {
  local bin="$1"; shift
  local out
  out=$(timeout 300 cargo test --locked --quiet --test "$bin" -- --exact "$@" 2>&1) || {
    echo "$out"; echo "67-hostile: FAIL: tests/$bin.rs" >&2; exit 1; }
  grep -q "test result: ok. $# passed" <<< "$out" || {
    echo "$out"; echo "67-hostile: FAIL: tests/$bin.rs ran other than the $# tests named" >&2; exit 1; }
  echo "67-hostile: tests/$bin.rs: $# passed"
}

# libtests <name>...: the named unit tests of the library, exact names.
libtests() {
  local out
  out=$(timeout 300 cargo test --locked --quiet --lib -- --exact "$@" 2>&1) || {
    echo "$out"; echo "67-hostile: FAIL: library unit tests" >&2; exit 1; }
  grep -q "test result: ok. $# passed" <<< "$out" || {
    echo "$out"; echo "67-hostile: FAIL: the library ran other than the $# unit tests named" >&2; exit 1; }
  echo "67-hostile: library: $# unit tests passed"
}

libtests \
  ffi::loader::tests::a_warn_logged_on_another_thread_reaches_the_bench_output \
  transport::droplog::tests::one_line_per_source_per_interval_with_the_count_in_the_next_line \
  transport::droplog::tests::the_process_gets_at_most_its_lines_per_interval_whatever_the_sources \
  transport::tcp::auth::tests::a_tag_binds_the_secret_the_challenge_and_every_field \
  transport::relay::wire::tests::requests_round_trip_and_tags_bind_the_challenge_and_every_field \
  transport::relay::wire::tests::malformed_requests_are_refused_naming_the_field \
  transport::relay::leg::tests::only_the_framing_is_checked \
  transport::tcp::window::tests::a_closed_window_suspends_the_timeout_and_data_in_flight_restores_it
tests handshake \
  garbage_clients_are_dropped_and_a_good_client_still_succeeds \
  real_sockets_garbage_clients_are_closed_and_a_good_client_still_succeeds \
  a_connection_without_a_hello_is_dropped_at_its_own_deadline \
  a_flood_of_silent_clients_does_not_lock_out_a_real_connector \
  a_flood_after_the_connector_connects_does_not_evict_it \
  eight_sources_holding_every_place_cannot_keep_the_real_connector_out \
  real_sockets_eight_sources_holding_every_place_cannot_keep_the_connector_out \
  real_sockets_silent_connections_from_the_connectors_own_address_cannot_keep_it_out \
  a_connector_dropped_before_its_hello_arrived_retries_and_gets_in \
  retries_back_off_and_end_at_the_timeout \
  the_process_wide_bound_holds_and_every_listener_keeps_its_reserve \
  the_listener_binds_only_the_addresses_it_advertises \
  a_hello_must_come_from_its_claimed_address_with_its_own_gid \
  a_replayed_hello_is_refused \
  a_wrong_answer_to_the_hello_fails_the_connector \
  an_unauthenticated_reject_is_not_acted_on_and_its_text_is_not_shown \
  rejected_connector_fails_with_the_acceptors_reason
tests handshake_fuzz \
  mutated_frames_never_panic_and_reencode_exactly \
  specific_malformed_frames_name_the_problem \
  fuzz_seed_files_decode
tests tcp_frame_fuzz \
  mutated_headers_never_panic_and_reencode_exactly \
  mutated_hellos_never_panic_and_reencode_exactly \
  mutated_challenges_and_acks_never_panic_and_reencode_exactly \
  fuzz_seed_files_decode
tests tcp \
  wrong_secret_is_rejected_by_the_acceptor \
  silent_and_garbage_peers_never_block_the_acceptor_or_touch_memory \
  streams_from_another_source_are_refused \
  silent_streams_from_the_peers_address_cannot_keep_its_streams_out \
  the_set_up_acceptor_takes_a_bounded_number_of_connections_per_poll \
  a_receiver_that_stops_reading_longer_than_the_user_timeout_is_not_cut_off \
  writes_outside_a_registration_are_refused_and_fail_the_path \
  out_of_order_frames_past_the_bound_fail_the_path \
  a_close_frame_with_any_flags_ends_posted_receives \
  a_sending_endpoint_refuses_writes_into_its_send_buffers \
  memory_keys_are_random_per_registration \
  random_frames_never_write_outside_a_registration \
  a_connect_to_a_peer_that_does_not_accept_never_blocks
tests tcp_failover \
  a_recorded_stream_hello_replayed_at_a_higher_generation_takes_nothing_over \
  a_foreign_reconnect_stream_is_closed_and_changes_nothing \
  a_spray_over_many_connections_listeners_logs_at_most_the_process_limit \
  a_peer_that_rebuilds_a_path_again_and_again_is_held_to_the_rebuild_rate
tests route acceptor_refuses_connector_addresses_no_peer_can_have
tests backend \
  attacks_on_the_listen_comm_leave_it_serving_the_real_connector \
  abandoned_connects_are_swept_by_accept_listen_and_close_listen
tests lying_sender \
  a_write_larger_than_the_posted_buffer_fails_the_receive \
  a_size_record_larger_than_the_posted_buffer_fails_the_receive \
  a_size_record_of_another_sequence_fails_the_receive \
  an_immediate_for_an_unposted_buffer_or_sequence_fails_the_receive \
  a_replayed_immediate_is_refused_or_ignored_as_a_late_copy \
  inconsistent_or_duplicate_pieces_fail_the_receive \
  a_write_outside_the_registration_lands_nothing \
  a_clear_to_send_that_wraps_the_address_space_fails_the_send \
  control_memory_that_wraps_is_refused_at_connect
tests transport a_timed_out_receive_ends_the_comm_instead_of_reusing_its_slot
tests relay hostile_clients_at_the_relay_door_are_refused_counted_and_cost_nobody_else
tests relay_fuzz \
  mutated_requests_never_panic_and_reencode_exactly \
  mutated_verdicts_and_challenges_never_panic_and_reencode_exactly \
  mutated_staging_descriptors_never_panic_and_reencode_exactly \
  mutated_leg_setup_messages_never_panic_and_reencode_exactly
tests relay_verbs \
  a_client_that_writes_out_of_order_or_outside_bs_buffer_ends_the_leg_and_lands_nothing \
  a_relay_that_credits_writes_never_sent_fails_the_path_naming_it \
  a_verbs_leg_the_relay_cannot_make_or_a_malformed_set_up_is_refused_and_counted

timeout 600 tests/netns/hostile.sh
echo "67-hostile: ok"
