//! Host discovery from kernel files through a root directory, the host model, NCCL device grouping, doctor.
#![forbid(unsafe_code)]
