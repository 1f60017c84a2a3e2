//! Routing: pure functions deciding which local links and remote addresses carry a connection.
//! No I/O here; inputs come from the host model (local side) and the peer's listen handle (remote side).
#![forbid(unsafe_code)]

pub mod handle;
pub mod select;
pub mod standby;
pub mod types;

pub use handle::{Handle, HandleRepr};
pub use select::{
    Closeness, DevOverride, KindFilter, PathChoice, Reach, RouteOptions, Selection, Skipped,
    check_incoming, closeness, kernel_route, render_text, select,
};
pub use standby::standby;
pub use types::{point_to_point, point_to_point_peers};
