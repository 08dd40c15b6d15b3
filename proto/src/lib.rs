//! Generated protobuf messages and gRPC clients/servers for the `boxoffice.v1`
//! API (see `boxoffice/v1/boxoffice.proto`; the reference is `docs/api.md` in this repository).
//!
//! The code is generated at build time by `build.rs` with protox and
//! tonic-prost-build; no system `protoc` is needed.

/// The `boxoffice.v1` package: messages, enums, and per-service `*_client` /
/// `*_server` modules.
#[allow(missing_docs, clippy::all, clippy::pedantic, clippy::nursery)]
pub mod v1 {
    tonic::include_proto!("boxoffice.v1");
}

/// The nodes' internal Raft protocol (`boxoffice.cluster.v1`), not part of the public API.
#[allow(missing_docs, clippy::all, clippy::pedantic, clippy::nursery)]
pub mod cluster {
    tonic::include_proto!("boxoffice.cluster.v1");
}

/// Encoded `google.protobuf.FileDescriptorSet` of the `boxoffice.v1` protos,
/// for `tonic-reflection`.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/boxoffice_descriptor.bin"));

pub mod pow;
