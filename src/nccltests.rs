//! Parser for NVIDIA nccl-tests output and its summary.
#![forbid(unsafe_code)]
