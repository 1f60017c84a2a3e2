//! Layouts the two sides of a connection share: the clear-to-send (CTS) FIFO slot, the size records,
//! the 32-bit immediate, work-request ids and the control-memory exchange ([`CtrlInfo`]).
//!
//! All of it is 64-bit words in little-endian host order (both ends run the same plugin; RDMA copies
//! bytes verbatim). Everything read from the peer is validated before use.
#![forbid(unsafe_code)]

use crate::error::{Error, Result};
use crate::transport::stripe::MAX_PATHS;

/// Receive buffers grouped under one request (NCCL's `maxRecvs`).
pub const MAX_RECVS: usize = 8;
/// Concurrent requests per comm (`NCCL_NET_MAX_REQUESTS`).
pub const MAX_REQUESTS: usize = 32;
/// Concurrent send requests per send comm (`MAX_REQUESTS × MAX_RECVS`, per NCCL's README).
pub const MAX_SEND_REQUESTS: usize = MAX_REQUESTS * MAX_RECVS;
/// CTS FIFO slots: one per outstanding grouped receive.
pub const FIFO_DEPTH: usize = MAX_REQUESTS;

/// Words per CTS FIFO slot (512 bytes, so slots never share a cache line).
pub const SLOT_WORDS: usize = 64;
/// Word 0 of a slot: `seq + 1`. It lands in the same write as the rest of the entry, in any order
/// with it, so it only names the entry the slot should hold; [`check_slot`] says whether it is whole.
pub const SLOT_IDX: usize = 0;
/// Word 1 of a slot: header (`n`, data path count, magic).
pub const SLOT_HDR: usize = 1;
/// First element word.
pub const SLOT_ELEMS: usize = 2;
/// Words per element: addr, size, tag, 4 words of rkeys (2 per word).
pub const ELEM_WORDS: usize = 3 + MAX_PATHS / 2;
const SLOT_MAGIC: u64 = 0x5C75;
/// Seeds [`slot_check`] (and names the layout: an entry of another layout never checks).
const CHECK_SEED: u64 = 0x5357_4354_5331_0005; // "SWCTS1", version 5

const _: () = assert!(slot_entry_words(MAX_RECVS) <= SLOT_WORDS);

/// One buffer of a clear-to-send entry: where the sender may write and how much.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CtsElem {
    /// Receive buffer address.
    pub addr: u64,
    /// Receive buffer size in bytes.
    pub size: u64,
    /// NCCL tag (the sender's rank).
    pub tag: u32,
    /// Remote keys of the buffer, per data path.
    pub rkeys: [u32; MAX_PATHS],
}

/// Words of the entry for `n` buffers, from [`SLOT_IDX`] through its check word: what one RDMA
/// write carries (`n` = 1: 10 words, 80 bytes).
pub const fn slot_entry_words(n: usize) -> usize {
    SLOT_ELEMS + n * ELEM_WORDS + 1
}

/// The check word of an entry: a digest of every word before it (index, header, elements).
///
/// Each step `h ← mix((h ⊕ w) · K)` is a bijection of `w` for a given `h` and of `h` for a given
/// `w`, so two word lists that differ in exactly one word never share a digest, whichever word
/// it is; other differences (several stale words, words swapped) collide with probability about
/// 2^-64. The length enters first: entries of different `n` do not alias.
pub fn slot_check(words: &[u64]) -> u64 {
    let mut h = CHECK_SEED ^ (words.len() as u64).wrapping_mul(0xff51_afd7_ed55_8ccd);
    for &w in words {
        h = (h ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 29;
    }
    // murmur3's finaliser: every output bit depends on every input bit.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Encodes the whole entry for sequence `seq` (index, header, elements, check word) into `words`;
/// returns its length in words ([`slot_entry_words`]), all of which go in one write.
pub fn encode_slot(
    seq: u64,
    elems: &[CtsElem],
    npaths: usize,
    words: &mut [u64; SLOT_WORDS],
) -> usize {
    encode_slot_with(seq, elems, npaths, 0, words, slot_check)
}

/// [`encode_slot`] for an entry that lacks the keys of the data paths in `missing` (bit `k`: path
/// `k`; see [`slot_keys_missing`]): the header says so, under the check word like every other.
pub fn encode_slot_lacking(
    seq: u64,
    elems: &[CtsElem],
    npaths: usize,
    missing: u8,
    words: &mut [u64; SLOT_WORDS],
) -> usize {
    encode_slot_with(seq, elems, npaths, missing, words, slot_check)
}

fn encode_slot_with(
    seq: u64,
    elems: &[CtsElem],
    npaths: usize,
    missing: u8,
    words: &mut [u64; SLOT_WORDS],
    check: fn(&[u64]) -> u64,
) -> usize {
    words[SLOT_IDX] = seq.wrapping_add(1);
    words[SLOT_HDR] = with_keys_missing(
        elems.len() as u64 | ((npaths as u64) << 8) | (SLOT_MAGIC << 32),
        missing,
    );
    for (e, el) in elems.iter().enumerate() {
        let b = SLOT_ELEMS + e * ELEM_WORDS;
        words[b] = el.addr;
        words[b + 1] = el.size;
        words[b + 2] = u64::from(el.tag);
        for k in 0..MAX_PATHS / 2 {
            words[b + 3 + k] = u64::from(el.rkeys[2 * k]) | (u64::from(el.rkeys[2 * k + 1]) << 32);
        }
    }
    let c = slot_entry_words(elems.len()) - 1;
    words[c] = check(&words[..c]);
    c + 1
}

/// Bits 16..24 of a slot's header word: the data paths (bit `k`: path `k`) whose keys this entry
/// lacks, because the receiver had not registered on their devices yet (standby paths, registered
/// at their first use). The sender posts nothing of the entry's messages on such a path until the
/// receiver's key update for the slot has landed in the key area ([`KEY_WORDS`]). 0: every key.
const SLOT_MISSING_SHIFT: u32 = 16;

/// `hdr` with the paths in `missing` marked keyless (see [`slot_keys_missing`]).
pub fn with_keys_missing(hdr: u64, missing: u8) -> u64 {
    (hdr & !(0xff << SLOT_MISSING_SHIFT)) | (u64::from(missing) << SLOT_MISSING_SHIFT)
}

/// The data paths whose keys the entry with header `hdr` lacks (bits past the connection's paths
/// are the peer's error: the sender never uses them).
pub fn slot_keys_missing(hdr: u64) -> u8 {
    (hdr >> SLOT_MISSING_SHIFT) as u8
}

/// Words of one key update: word 0 is the slot's sequence number + 1 (the entry it completes),
/// words 1.. the buffers' remote keys on one data path, two per word (buffer `2i` low, `2i + 1`
/// high). The sender's control block ends with one such area per data path and FIFO slot
/// ([`key_area`]), after the fence inbox; the area of path `k` is written only over path `k`.
pub const KEY_WORDS: usize = 1 + MAX_RECVS / 2;

/// Words of the key area for `npaths` data paths.
pub fn key_area_words(npaths: usize) -> usize {
    npaths * FIFO_DEPTH * KEY_WORDS
}

/// Offset, within the key area, of the update for FIFO slot `slot` over data path `k`.
pub fn key_area(k: usize, slot: usize) -> usize {
    (k * FIFO_DEPTH + slot) * KEY_WORDS
}

/// Encodes a key update for the entry of sequence `seq`: `rkeys[e]` is buffer `e`'s key.
pub fn encode_keys(seq: u64, rkeys: &[u32; MAX_RECVS], out: &mut [u64; KEY_WORDS]) {
    out[0] = seq + 1;
    for i in 0..MAX_RECVS / 2 {
        out[1 + i] = u64::from(rkeys[2 * i]) | (u64::from(rkeys[2 * i + 1]) << 32);
    }
}

/// Buffer `e`'s key from the key words (words 1.. of an update).
pub fn decode_key(words: &[u64], e: usize) -> u32 {
    words.get(e / 2).map_or(0, |w| (w >> (32 * (e % 2))) as u32)
}

/// How many words [`check_slot`] needs, given the slot's header word as read: the entry's length
/// for the `n` it names, or 2 (index and header only) when `n` is out of range.
pub fn slot_words_to_read(hdr: u64) -> usize {
    match (hdr & 0xff) as usize {
        n @ 1..=MAX_RECVS => slot_entry_words(n),
        _ => SLOT_HDR + 1,
    }
}

/// Judges the words read from a FIFO slot (from [`SLOT_IDX`], at least
/// [`slot_words_to_read`]`(w[SLOT_HDR])` of them) against the entry expected there, `seq`.
///
/// `Ok(None)`: not (yet) a whole entry for `seq`: an older entry, or one whose write has landed in
/// part (any subset of its words, in any order, over the older entry's): the sender polls again.
/// `Ok(Some(n))`: every word is the one the receiver wrote (index, header, elements and check
/// agree), and the header is valid for `npaths`. `Err`: a whole entry the receiver must not have
/// written (bad magic, `n`, path count): a broken or hostile peer.
pub fn check_slot(w: &[u64], seq: u64, npaths: usize) -> Result<Option<usize>> {
    check_slot_with(w, seq, npaths, slot_check)
}

fn check_slot_with(
    w: &[u64],
    seq: u64,
    npaths: usize,
    check: fn(&[u64]) -> u64,
) -> Result<Option<usize>> {
    if w.len() <= SLOT_HDR || w[SLOT_IDX] != seq.wrapping_add(1) {
        return Ok(None);
    }
    let hdr = w[SLOT_HDR];
    let n = (hdr & 0xff) as usize;
    if n == 0 {
        // The header of a slot never written before has not landed yet.
        return Ok(None);
    }
    if n > MAX_RECVS {
        // Not a tear: every value the low byte ever held is 0 or an entry's own n (the byte lands
        // whole). The peer wrote this.
        return decode_slot_header(hdr, npaths).map(Some);
    }
    let c = slot_entry_words(n) - 1;
    if w.len() <= c || w[c] != check(&w[..c]) {
        return Ok(None);
    }
    decode_slot_header(hdr, npaths).map(Some)
}

/// What the sender's failover snapshot reports for a slot, given all of its words: the index word
/// when the entry it names is whole (the sender has taken it or will), else 0, which tells the
/// receiver that the entry it wrote there has not landed (the receiver posts it again).
pub fn slot_landed(w: &[u64; SLOT_WORDS]) -> u64 {
    let idx = w[SLOT_IDX];
    let n = (w[SLOT_HDR] & 0xff) as usize;
    if idx == 0 || n == 0 || n > MAX_RECVS {
        return 0;
    }
    let c = slot_entry_words(n) - 1;
    if w[c] == slot_check(&w[..c]) { idx } else { 0 }
}

/// Decodes the header word; returns `n`. Checks the magic, `n` and that the peer has `npaths` data
/// paths like us.
pub fn decode_slot_header(hdr: u64, npaths: usize) -> Result<usize> {
    let n = (hdr & 0xff) as usize;
    let their_paths = ((hdr >> 8) & 0xff) as usize;
    if hdr >> 32 != SLOT_MAGIC {
        return Err(Error::Remote(format!(
            "clear-to-send entry has magic {:#x}; expected {SLOT_MAGIC:#x} (corrupt FIFO write)",
            hdr >> 32
        )));
    }
    if n == 0 || n > MAX_RECVS {
        return Err(Error::Remote(format!(
            "clear-to-send entry groups {n} receive buffers; accepted: 1..={MAX_RECVS}"
        )));
    }
    if their_paths != npaths {
        return Err(Error::Remote(format!(
            "clear-to-send entry was written for {their_paths} data paths; this connection has {npaths}"
        )));
    }
    Ok(n)
}

/// Decodes one element from its [`ELEM_WORDS`] words.
pub fn decode_elem(w: &[u64]) -> CtsElem {
    let mut el = CtsElem {
        addr: w[0],
        size: w[1],
        tag: w[2] as u32,
        rkeys: [0; MAX_PATHS],
    };
    for k in 0..MAX_PATHS / 2 {
        el.rkeys[2 * k] = w[3 + k] as u32;
        el.rkeys[2 * k + 1] = (w[3 + k] >> 32) as u32;
    }
    el
}

/// Size record the sender writes into the receiver's record array before the immediate that
/// completes the element: the size (48 bits) and the low 16 bits of the slot's sequence number.
pub fn encode_record(size: u64, seq: u64) -> u64 {
    (size & RECORD_SIZE_MASK) | ((seq & 0xffff) << 48)
}

/// Largest message the record can describe (2^48 − 1 bytes).
pub const RECORD_SIZE_MASK: u64 = (1 << 48) - 1;

/// Decodes a size record; checks the sequence number.
pub fn decode_record(word: u64, seq: u64) -> Result<u64> {
    if word >> 48 != seq & 0xffff {
        return Err(Error::Remote(format!(
            "size record carries sequence {:#x}; expected {:#x} (stale or corrupt write)",
            word >> 48,
            seq & 0xffff
        )));
    }
    Ok(word & RECORD_SIZE_MASK)
}

/// The immediate carried by the last write of each piece of an element (a piece is one chunk of the
/// stripe; the piece that carries the size record ends with the record write).
///
/// The piece index lets the receiver keep a bitmap per buffer: a piece sent again over a surviving
/// path after its first path failed (its write may have landed with the completion lost) is counted
/// once, however often it arrives.
///
/// A message of one piece that one write carries (1 byte to [`MAX_WR_BYTES`](crate::transport::comm::MAX_WR_BYTES))
/// has no size record: [`Imm::len_is_size`] says the size is that write's length, which the receive
/// completion reports (`byte_len`), so the message costs one write with immediate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Imm {
    /// FIFO slot of the grouped receive.
    pub slot: usize,
    /// Buffer index within the grouped receive.
    pub elem: usize,
    /// How many pieces the element was split into (1..=8).
    pub npieces: usize,
    /// This piece's index (0..npieces); piece 0 carries the size record.
    pub piece: usize,
    /// Low 16 bits of the slot's sequence number.
    pub seq16: u16,
    /// The message is this one write (one piece, no size record): its size is the write's length.
    pub len_is_size: bool,
}

const _: () = assert!(FIFO_DEPTH <= 32 && MAX_RECVS <= 8 && MAX_PATHS <= 8);

impl Imm {
    /// Packs: slot in bits 0..5, elem in 5..8, npieces−1 in 8..11, piece in 11..14, `len_is_size` in
    /// bit 14, bit 15 zero, seq16 in 16..32.
    pub fn encode(self) -> u32 {
        (self.slot as u32 & 0x1f)
            | ((self.elem as u32 & 0x7) << 5)
            | (((self.npieces as u32).wrapping_sub(1) & 0x7) << 8)
            | ((self.piece as u32 & 0x7) << 11)
            | (u32::from(self.len_is_size) << 14)
            | (u32::from(self.seq16) << 16)
    }

    /// Unpacks and validates against the FIFO depth and the piece count.
    pub fn decode(v: u32) -> Result<Imm> {
        let imm = Imm {
            slot: (v & 0x1f) as usize,
            elem: ((v >> 5) & 0x7) as usize,
            npieces: (((v >> 8) & 0x7) + 1) as usize,
            piece: ((v >> 11) & 0x7) as usize,
            seq16: (v >> 16) as u16,
            len_is_size: v & (1 << 14) != 0,
        };
        let whole_one_piece = !imm.len_is_size || imm.npieces == 1;
        if v & 0x8000 != 0 || imm.slot >= FIFO_DEPTH || imm.piece >= imm.npieces || !whole_one_piece
        {
            return Err(Error::Remote(format!(
                "immediate {v:#010x} is not one of ours (slot {} of {FIFO_DEPTH}, piece {} of {}, size in the write's length {}, reserved bit {})",
                imm.slot,
                imm.piece,
                imm.npieces,
                imm.len_is_size,
                (v >> 15) & 1
            )));
        }
        Ok(imm)
    }
}

/// Kinds of work requests, in the top byte of `wr_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrKind {
    /// Data and record writes of a send request.
    Send = 1,
    /// Clear-to-send writes of a receive request.
    Cts = 2,
    /// Pre-posted receives for immediates.
    Recv = 3,
    /// Flush reads.
    Flush = 4,
    /// The failover fence's writes (a stop request or a publish, see [`FenceLayout`]).
    Fence = 5,
    /// A receiver's key update ([`KEY_WORDS`]); the index is `path × FIFO_DEPTH + slot`.
    Keys = 6,
}

/// Builds a `wr_id`: kind, request index, generation.
pub fn wr_id(kind: WrKind, index: usize, generation: u32) -> u64 {
    ((kind as u64) << 56) | (u64::from(generation) << 16) | (index as u64 & 0xffff)
}

/// A send's `wr_id` naming also the piece (bits 48..56), so a completion says which piece of the
/// request it finished.
pub fn wr_id_piece(index: usize, generation: u32, piece: usize) -> u64 {
    wr_id(WrKind::Send, index, generation) | ((piece as u64 & 0xff) << 48)
}

/// The piece named by [`wr_id_piece`] (0 for other kinds).
pub fn wr_piece(id: u64) -> usize {
    ((id >> 48) & 0xff) as usize
}

/// Splits a `wr_id`; `None` for a kind we never post.
pub fn split_wr_id(id: u64) -> Option<(WrKind, usize, u32)> {
    let kind = match id >> 56 {
        1 => WrKind::Send,
        2 => WrKind::Cts,
        3 => WrKind::Recv,
        4 => WrKind::Flush,
        5 => WrKind::Fence,
        6 => WrKind::Keys,
        _ => return None,
    };
    Some((
        kind,
        (id & 0xffff) as usize,
        ((id >> 16) & 0xffff_ffff) as u32,
    ))
}

/// Where the failover fence's words sit (see `docs/failover.md`, "Exactly once"). Each side's
/// control block (the sender's CTS FIFO, the receiver's size records) ends with an **inbox** the
/// peer writes, one area per data path the peer writes it over (writes on one path land in order,
/// writes on different paths do not: an area is only ever written over its own path, so an older
/// write can never land over a newer one). An area holds:
///
/// * `req` ([`MAX_PATHS`] words): word `k` is how many times the writer has stopped data path `k`
///   (its "stop epoch": every later write of it is at least as large);
/// * `ack` ([`MAX_PATHS`] words): word `k` is the reader's stop epoch of path `k` that the writer
///   has answered: it had sealed its end of `k` (nothing more of it lands) before it took the
///   snapshot that precedes this word on the same path;
/// * the writer's snapshot: the sender's is the index word of each FIFO slot whose entry is whole,
///   0 for one landed in part ([`slot_landed`]: which clear-to-send entries landed, [`FIFO_DEPTH`]
///   words); the receiver's is one [`have_word`] per slot and buffer
///   (which pieces landed, [`FIFO_DEPTH`] × [`MAX_RECVS`] words).
///
/// A side writes from an outbox of the same shape in its own control memory, one area per path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceLayout {
    /// Data paths of the connection.
    pub npaths: usize,
    /// Words of the writer's snapshot.
    pub snap: usize,
}

/// Words of the sender's fence snapshot: one FIFO index word per slot ([`slot_landed`]).
pub const SEND_SNAP_WORDS: usize = FIFO_DEPTH;
/// Words of the receiver's fence snapshot: one [`have_word`] per slot and buffer.
pub const RECV_SNAP_WORDS: usize = FIFO_DEPTH * MAX_RECVS;

impl FenceLayout {
    /// Offset of `req` in an area.
    pub const REQ: usize = 0;
    /// Offset of `ack` in an area.
    pub const ACK: usize = MAX_PATHS;
    /// Offset of the snapshot in an area.
    pub const SNAP: usize = 2 * MAX_PATHS;

    /// Words of one area.
    pub fn area_words(&self) -> usize {
        Self::SNAP + self.snap
    }

    /// Words of the whole inbox (or outbox).
    pub fn words(&self) -> usize {
        self.npaths * self.area_words()
    }

    /// Offset of path `j`'s area.
    pub fn area(&self, j: usize) -> usize {
        j * self.area_words()
    }
}

/// The receiver's snapshot word for one buffer of one FIFO slot: the slot's newest sequence
/// number plus one (bits 8..64; 0: the slot was never used) and the pieces of this buffer that have
/// landed (bits 0..8; all set once the buffer is complete, and for a slot whose receive completed).
pub fn have_word(seq: u64, seen: u8) -> u64 {
    ((seq + 1) << 8) | u64::from(seen)
}

/// Whether the receiver's snapshot word `w` (see [`have_word`]) says that piece `piece` of the
/// message with sequence number `seq` has landed. A receiver that has moved past `seq` completed
/// it (a receive is released only complete; a failed one ends the connection). A word from
/// before `seq` cannot come from an honest peer: it posted the clear-to-send of `seq` first.
pub fn piece_landed(w: u64, seq: u64, piece: usize) -> Result<bool> {
    let have = w >> 8;
    let want = seq + 1;
    if have < want {
        return Err(Error::Remote(format!(
            "the receiver's failover snapshot shows sequence {} in the slot of message {seq}, whose \
             clear-to-send it posted (corrupt or hostile write)",
            have.wrapping_sub(1) as i64
        )));
    }
    Ok(have > want || w & (1 << (piece & 7)) != 0)
}

/// What one side tells the other about its control memory, exchanged once by the handshake:
/// the sender's CTS FIFO, or the receiver's size records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtrlInfo {
    /// Address of word 0.
    pub addr: u64,
    /// Words available from `addr`.
    pub words: u32,
    /// Remote key per data path.
    pub rkeys: Vec<u32>,
    /// Standby data paths (bit `k`: path `k`): the connector set them up to take over when a
    /// carrying path fails; both ends send nothing new on them until then. 0: none.
    pub standby: u8,
}

const CTRL_MAGIC: u32 = 0x5357_4c43; // "SWLC"
/// Version 5: a clear-to-send entry is one write carrying its sequence and a check word
/// ([`check_slot`]), and may lack the keys of standby paths the receiver has not registered on yet
/// ([`slot_keys_missing`]): the sender's control block ends with the key area ([`KEY_WORDS`] per
/// data path and FIFO slot, after the fence inbox) where they arrive at first use. A version-4
/// sender would wait for an index word written after the body and take a torn entry, a version-4
/// receiver would write two. Version 4: each side's control block ends with a fence inbox
/// ([`FenceLayout`]) that the peer writes when a path fails, and failover waits for it (a
/// version-3 peer would neither write nor answer). Version 3: a one-write message carries no size
/// record (the immediate's bit 14 says its size is the write's length), which a version-2
/// receiver rejects as a foreign immediate. Version 2: immediates name their piece (failover); a
/// version-1 peer counts immediates per path and would misread them. Peers of different versions
/// refuse each other here.
const CTRL_VERSION: u8 = 5;

/// What a data-protocol version is, for the refusal of a peer that speaks another one.
fn version_name(v: u8) -> &'static str {
    match v {
        1 => "per-path immediate counts",
        2 => "immediates name their piece",
        3 => "one-write messages without a size record",
        4 => "two-write clear-to-send: body, then index word",
        5 => "one-write clear-to-send with a check word, standby keys at first use",
        _ => "unknown to this plugin",
    }
}

impl CtrlInfo {
    /// Encoded size for `npaths` data paths: 20 + 4 × npaths bytes (52 bytes for 8 paths).
    pub fn encoded_len(npaths: usize) -> usize {
        20 + 4 * npaths
    }

    /// Encodes: magic u32, version u8, npaths u8, standby mask u8, 1 reserved byte, addr u64,
    /// words u32, rkeys. (The mask byte was reserved, zero, before standby paths: such a peer
    /// reads none.)
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::encoded_len(self.rkeys.len()));
        v.extend_from_slice(&CTRL_MAGIC.to_le_bytes());
        v.push(CTRL_VERSION);
        v.push(self.rkeys.len() as u8);
        v.extend_from_slice(&[self.standby, 0]);
        v.extend_from_slice(&self.addr.to_le_bytes());
        v.extend_from_slice(&self.words.to_le_bytes());
        for k in &self.rkeys {
            v.extend_from_slice(&k.to_le_bytes());
        }
        v
    }

    /// Decodes untrusted bytes from the peer; the error names what was wrong.
    pub fn from_bytes(b: &[u8]) -> Result<CtrlInfo> {
        if b.len() < 20 {
            return Err(Error::Remote(format!(
                "control-memory info is {} bytes; at least 20 expected",
                b.len()
            )));
        }
        let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if magic != CTRL_MAGIC {
            return Err(Error::Remote(format!(
                "control-memory info has magic {magic:#x}; expected {CTRL_MAGIC:#x}"
            )));
        }
        if b[4] != CTRL_VERSION {
            return Err(Error::Remote(format!(
                "the peer speaks data-protocol version {} ({}); this plugin speaks version \
                 {CTRL_VERSION} ({}): both ranks need the same switchless release",
                b[4],
                version_name(b[4]),
                version_name(CTRL_VERSION)
            )));
        }
        let npaths = b[5] as usize;
        if npaths == 0 || npaths > MAX_PATHS {
            return Err(Error::Remote(format!(
                "control-memory info lists {npaths} paths; accepted: 1..={MAX_PATHS}"
            )));
        }
        if b.len() != Self::encoded_len(npaths) {
            return Err(Error::Remote(format!(
                "control-memory info is {} bytes; {} expected for {npaths} paths",
                b.len(),
                Self::encoded_len(npaths)
            )));
        }
        let standby = b[6];
        if standby >> npaths != 0 || standby.count_ones() as usize == npaths {
            return Err(Error::Remote(format!(
                "control-memory info marks paths {standby:#010b} standby of {npaths}; accepted: \
                 a subset of the paths that leaves at least one carrying"
            )));
        }
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[8..16]);
        let words = u32::from_le_bytes([b[16], b[17], b[18], b[19]]);
        let rkeys = b[20..]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(CtrlInfo {
            addr: u64::from_le_bytes(a),
            words,
            rkeys,
            standby,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn elems(n: usize, salt: u64) -> Vec<CtsElem> {
        (0..n)
            .map(|i| CtsElem {
                addr: 0x1000 * (i as u64 + 1) + (salt << 20),
                size: 77 + i as u64 + salt,
                tag: 0xffff_fff0 + i as u32,
                rkeys: [i as u32, 1, 2, 3, 4, 5, 6, u32::MAX ^ salt as u32],
            })
            .collect()
    }

    #[test]
    fn slot_roundtrip() {
        let el = elems(3, 0);
        let mut w = [0u64; SLOT_WORDS];
        assert_eq!(encode_slot(41, &el, 4, &mut w), slot_entry_words(3));
        assert_eq!(w[SLOT_IDX], 42);
        assert_eq!(slot_words_to_read(w[SLOT_HDR]), slot_entry_words(3));
        assert_eq!(check_slot(&w, 41, 4).unwrap(), Some(3));
        assert_eq!(slot_landed(&w), 42);
        for (i, e) in el.iter().enumerate() {
            let b = SLOT_ELEMS + i * ELEM_WORDS;
            assert_eq!(decode_elem(&w[b..b + ELEM_WORDS]), *e);
        }
        // Another sequence expected: not yet.
        assert_eq!(check_slot(&w, 9, 4).unwrap(), None);
        // Whole, but for another path count: the peer is refused by name.
        let e = check_slot(&w, 41, 2).unwrap_err().to_string();
        assert!(e.contains("4 data paths"), "{e}");
        assert!(decode_slot_header(0, 4).is_err());
        assert!(decode_slot_header((SLOT_MAGIC << 32) | (4 << 8) | 9, 4).is_err());
        assert_eq!(slot_entry_words(1), 10);
        assert_eq!(slot_words_to_read(0), 2);
    }

    #[test]
    fn a_whole_entry_the_receiver_cannot_have_written_is_an_error() {
        let mut w = [0u64; SLOT_WORDS];
        let len = encode_slot(0, &elems(1, 0), 2, &mut w);
        // Bad magic, with a check word that matches: the peer wrote it so.
        w[SLOT_HDR] ^= 1 << 40;
        w[len - 1] = slot_check(&w[..len - 1]);
        assert!(
            check_slot(&w, 0, 2)
                .unwrap_err()
                .to_string()
                .contains("magic")
        );
        // Nine buffers: no tear shows it (n's byte is 0 or an entry's).
        w[SLOT_HDR] = (SLOT_MAGIC << 32) | (2 << 8) | 9;
        let e = check_slot(&w, 0, 2).unwrap_err().to_string();
        assert!(e.contains("accepted: 1..=8"), "{e}");
        // The same entry whose check does not match is only "not yet".
        let len = encode_slot(0, &elems(1, 0), 2, &mut w);
        w[len - 1] ^= 1;
        assert_eq!(check_slot(&w, 0, 2).unwrap(), None);
        assert_eq!(slot_landed(&w), 0);
    }

    /// The slot as a torn write leaves it: word `i` of the new entry landed when bit `i` of `mask`
    /// is set, else the slot still holds the old word there.
    fn torn(
        old: &[u64; SLOT_WORDS],
        new: &[u64; SLOT_WORDS],
        len: usize,
        mask: u64,
    ) -> [u64; SLOT_WORDS] {
        let mut w = *old;
        for i in 0..len {
            if mask >> i & 1 == 1 {
                w[i] = new[i];
            }
        }
        w
    }

    /// Searches the tears of an entry (`new`, `len` words, sequence `seq`) over `old` for one that
    /// `accept` takes although the slot does not hold the entry; `Some(mask)` of the first.
    /// Exhaustive over every subset of words for entries up to 20 words.
    fn find_torn_accepted(
        old: &[u64; SLOT_WORDS],
        new: &[u64; SLOT_WORDS],
        len: usize,
        accept: &dyn Fn(&[u64; SLOT_WORDS]) -> bool,
    ) -> Option<u64> {
        assert!(len <= 20);
        (0..1u64 << len).find(|&mask| {
            let w = torn(old, new, len, mask);
            accept(&w) && w[..len] != new[..len]
        })
    }

    /// The previous generations a slot may hold under a new entry: never written, an entry of the
    /// same buffers (NCCL reposts the same buffers), of other buffers, of more and of fewer.
    fn olds(seq: u64, npaths: usize) -> Vec<[u64; SLOT_WORDS]> {
        let prev = seq.wrapping_sub(FIFO_DEPTH as u64);
        let mut v = vec![[0u64; SLOT_WORDS]];
        for (n, salt) in [(1, 0), (2, 0), (1, 5), (2, 9), (3, 0), (8, 3)] {
            let mut w = [0u64; SLOT_WORDS];
            encode_slot(prev, &elems(n, salt), npaths, &mut w);
            v.push(w);
        }
        v
    }

    #[test]
    fn no_torn_entry_is_ever_taken_and_a_whole_one_is() {
        let (seq, npaths) = (FIFO_DEPTH as u64 + 3, 2);
        let accept = |w: &[u64; SLOT_WORDS]| {
            check_slot(w, seq, npaths).unwrap() == Some(w[SLOT_HDR] as usize & 0xff)
        };
        for n in [1, 2] {
            let mut new = [0u64; SLOT_WORDS];
            let len = encode_slot(seq, &elems(n, 0), npaths, &mut new);
            for old in olds(seq, npaths) {
                assert_eq!(find_torn_accepted(&old, &new, len, &accept), None, "n={n}");
                let whole = torn(&old, &new, len, u64::MAX);
                assert_eq!(check_slot(&whole, seq, npaths).unwrap(), Some(n));
                // The failover snapshot: a torn entry never reports landed.
                let landed = |w: &[u64; SLOT_WORDS]| slot_landed(w) == seq + 1;
                assert_eq!(find_torn_accepted(&old, &new, len, &landed), None, "n={n}");
                assert_eq!(slot_landed(&whole), seq + 1);
            }
        }
    }

    /// The search above can fail: it finds the torn entries a naive check takes.
    #[test]
    fn the_tear_search_catches_naive_checks() {
        let (seq, npaths) = (FIFO_DEPTH as u64 + 3, 2);
        // Index only (the old two-write entry, sent as one write): takes any tear with the index.
        let idx_only = |w: &[u64; SLOT_WORDS]| w[SLOT_IDX] == seq + 1;
        // A digest that leaves out the index: a new index over the older entry's body and check.
        fn no_seq(w: &[u64]) -> u64 {
            slot_check(&w[1..])
        }
        // A plain XOR: blind to words that swap places.
        fn xor(w: &[u64]) -> u64 {
            w.iter().fold(0, |a, &x| a ^ x)
        }
        let with = |c: fn(&[u64]) -> u64| {
            move |w: &[u64; SLOT_WORDS]| {
                check_slot_with(w, seq, npaths, c).is_ok_and(|r| r.is_some())
            }
        };
        let mut new = [0u64; SLOT_WORDS];
        let len = encode_slot(seq, &elems(1, 0), npaths, &mut new);
        let old = olds(seq, npaths)[1];
        assert!(find_torn_accepted(&old, &new, len, &idx_only).is_some());
        let mut nn = [0u64; SLOT_WORDS];
        let nlen = encode_slot_with(seq, &elems(1, 0), npaths, 0, &mut nn, no_seq);
        let mut no = [0u64; SLOT_WORDS];
        encode_slot_with(
            seq - FIFO_DEPTH as u64,
            &elems(1, 5),
            npaths,
            0,
            &mut no,
            no_seq,
        );
        assert!(find_torn_accepted(&no, &nn, nlen, &with(no_seq)).is_some());
        // XOR: the same entry with two element words swapped is taken.
        let mut xn = [0u64; SLOT_WORDS];
        let xlen = encode_slot_with(seq, &elems(1, 0), npaths, 0, &mut xn, xor);
        xn.swap(SLOT_ELEMS, SLOT_ELEMS + 1);
        assert!(with(xor)(&xn));
        // The real check refuses the same swaps.
        let mut sn = new;
        sn.swap(SLOT_ELEMS, SLOT_ELEMS + 1);
        assert_eq!(check_slot(&sn, seq, npaths).unwrap(), None);
        let _ = xlen;
    }

    proptest! {
        /// Larger entries (up to 8 buffers), any subset of words landed, and words torn within
        /// (any bytes of each word new or old): only the whole entry is taken.
        #[test]
        fn torn_entries_are_never_taken(
            n in 1..=MAX_RECVS, old_n in 1..=MAX_RECVS, npaths in 1..=MAX_PATHS,
            seq in (FIFO_DEPTH as u64)..u64::MAX / 2, salt in 0u64..4,
            words in any::<u64>(), bytes in proptest::collection::vec(any::<u8>(), SLOT_WORDS),
        ) {
            let mut new = [0u64; SLOT_WORDS];
            let len = encode_slot(seq, &elems(n, salt), npaths, &mut new);
            let mut old = [0u64; SLOT_WORDS];
            encode_slot(seq - FIFO_DEPTH as u64, &elems(old_n, salt / 2), npaths, &mut old);
            // Word subset (wrapping the 64-bit mask over the entry), then byte tears.
            let mut w = torn(&old, &new, len, words.rotate_left(len as u32));
            for i in 0..len {
                let m = bytes[i];
                let bm = (0..8).fold(0u64, |a, b| if m >> b & 1 == 1 { a | 0xff << (8 * b) } else { a });
                w[i] = (new[i] & bm) | (w[i] & !bm);
            }
            let whole = w[..len] == new[..len];
            let got = check_slot(&w, seq, npaths).unwrap();
            prop_assert_eq!(got.is_some(), whole);
            prop_assert_eq!(slot_landed(&w) == seq + 1, whole);
        }

        /// Words in the wrong places (two swapped) are never taken.
        #[test]
        fn reordered_entries_are_never_taken(n in 1..=MAX_RECVS, i in 0..SLOT_WORDS, j in 0..SLOT_WORDS, seq in 0u64..1 << 40) {
            let mut w = [0u64; SLOT_WORDS];
            let len = encode_slot(seq, &elems(n, 1), 3, &mut w);
            let (i, j) = (i % len, j % len);
            prop_assume!(w[i] != w[j]);
            w.swap(i, j);
            prop_assert_eq!(check_slot(&w, seq, 3).unwrap_or(None), None);
        }
    }

    #[test]
    fn record_checks_sequence() {
        let w = encode_record(12345, 0x1_0007);
        assert_eq!(decode_record(w, 0x7).unwrap(), 12345);
        assert!(decode_record(w, 0x8).is_err());
    }

    #[test]
    fn imm_rejects_foreign_values() {
        assert!(Imm::decode(0xffff_ffff).is_err());
        // Piece 3 of 2.
        assert!(Imm::decode((1 << 8) | (3 << 11)).is_err());
        assert!(Imm::decode(1 << 15).is_err());
        // The size in the write's length, yet one of two pieces.
        assert!(Imm::decode((1 << 14) | (1 << 8)).is_err());
        let one = Imm::decode(1 << 14).unwrap();
        assert!(one.len_is_size && one.npieces == 1);
    }

    #[test]
    fn imm_layout_is_pinned() {
        let imm = Imm {
            slot: 31,
            elem: 7,
            npieces: 8,
            piece: 7,
            seq16: 0xbeef,
            len_is_size: false,
        };
        assert_eq!(imm.encode(), 0xbeef_3fff);
        let imm = Imm {
            slot: 3,
            elem: 1,
            npieces: 1,
            piece: 0,
            seq16: 0x0102,
            len_is_size: true,
        };
        assert_eq!(imm.encode(), 0x0102_4023);
        let imm = Imm {
            slot: 1,
            elem: 2,
            npieces: 3,
            piece: 1,
            seq16: 4,
            len_is_size: false,
        };
        assert_eq!(
            imm.encode(),
            0x0004_0000 | 1 | (2 << 5) | (2 << 8) | (1 << 11)
        );
    }

    #[test]
    fn wr_id_names_the_piece() {
        let id = wr_id_piece(255, 0xdead_beef, 5);
        assert_eq!(split_wr_id(id), Some((WrKind::Send, 255, 0xdead_beef)));
        assert_eq!(wr_piece(id), 5);
        assert_eq!(wr_piece(wr_id(WrKind::Cts, 3, 9)), 0);
    }

    #[test]
    fn the_snapshot_word_says_which_pieces_landed() {
        let w = have_word(40, 0b101);
        assert!(piece_landed(w, 40, 0).unwrap());
        assert!(!piece_landed(w, 40, 1).unwrap());
        assert!(piece_landed(w, 40, 2).unwrap());
        // The receiver moved on: message 40 completed, every piece landed.
        assert!(piece_landed(have_word(72, 0), 40, 1).unwrap());
        // Behind the receive it posted: a lie.
        assert!(piece_landed(have_word(8, 0xff), 40, 1).is_err());
        assert!(piece_landed(0, 0, 0).is_err());
        let l = FenceLayout {
            npaths: 3,
            snap: RECV_SNAP_WORDS,
        };
        assert_eq!(l.area_words(), 16 + 256);
        assert_eq!(l.words(), 3 * 272);
        assert_eq!(l.area(2), 544);
    }

    #[test]
    fn wr_id_roundtrip() {
        let id = wr_id(WrKind::Flush, 255, 0xdead_beef);
        assert_eq!(split_wr_id(id), Some((WrKind::Flush, 255, 0xdead_beef)));
        assert_eq!(split_wr_id(0), None);
    }

    #[test]
    fn ctrl_info_errors_name_the_problem() {
        let info = CtrlInfo {
            addr: 0xabc,
            words: 2048,
            rkeys: vec![1, 2, 3],
            standby: 0b110,
        };
        let b = info.to_bytes();
        assert_eq!(CtrlInfo::from_bytes(&b).unwrap(), info);
        // A path that does not exist, or no carrying path left.
        for mask in [0b1000, 0b111] {
            let mut bad = b.clone();
            bad[6] = mask;
            let e = CtrlInfo::from_bytes(&bad).unwrap_err().to_string();
            assert!(e.contains("standby"), "{e}");
        }
        assert!(
            CtrlInfo::from_bytes(&b[..10])
                .unwrap_err()
                .to_string()
                .contains("20")
        );
        let mut bad = b.clone();
        bad[4] = 9;
        assert!(
            CtrlInfo::from_bytes(&bad)
                .unwrap_err()
                .to_string()
                .contains("version 9")
        );
        // A version-4 peer (two-write clear-to-send) is refused by name.
        let mut old = b.clone();
        old[4] = 4;
        let e = CtrlInfo::from_bytes(&old).unwrap_err().to_string();
        assert!(
            e.contains("version 4 (two-write clear-to-send")
                && e.contains("version 5 (one-write clear-to-send"),
            "{e}"
        );
        let mut bad = b.clone();
        bad.push(0);
        assert!(CtrlInfo::from_bytes(&bad).is_err());
    }

    proptest! {
        #[test]
        fn imm_roundtrip(slot in 0..FIFO_DEPTH, elem in 0..MAX_RECVS, npieces in 1..=MAX_PATHS, p in 0..MAX_PATHS, seq16 in any::<u16>(), whole in any::<bool>()) {
            let len_is_size = whole && npieces == 1;
            let imm = Imm { slot, elem, npieces, piece: p % npieces, seq16, len_is_size };
            prop_assert_eq!(Imm::decode(imm.encode()).unwrap(), imm);
        }

        #[test]
        fn key_updates_and_keyless_bits_roundtrip(seq in 0u64..1 << 62, keys in any::<[u32; MAX_RECVS]>(), hdr in any::<u64>(), missing in any::<u8>()) {
            let mut w = [0u64; KEY_WORDS];
            encode_keys(seq, &keys, &mut w);
            prop_assert_eq!(w[0], seq + 1);
            for (e, &k) in keys.iter().enumerate() {
                prop_assert_eq!(decode_key(&w[1..], e), k);
            }
            let h = with_keys_missing(hdr, missing);
            prop_assert_eq!(slot_keys_missing(h), missing);
            // The bits share the header with n, the path count and the magic: untouched.
            prop_assert_eq!(h & !(0xff << 16), hdr & !(0xff << 16));
        }

        #[test]
        fn ctrl_info_decoder_never_panics(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = CtrlInfo::from_bytes(&b);
        }
    }
}
