//! Compiles `boxoffice/v1/*.proto` with protox (pure Rust, no `protoc`), writes
//! the encoded `FileDescriptorSet` to `$OUT_DIR/boxoffice_descriptor.bin` (for
//! server reflection) and generates prost messages plus tonic clients/servers.

use std::{env, error::Error, fs, path::PathBuf};

use prost::Message as _;

/// Proto files to compile, relative to the crate directory (the include root).
const PROTOS: &[&str] = &["boxoffice/v1/boxoffice.proto"];
/// The nodes' internal protocol: generated too, but kept out of the descriptor set that server
/// reflection describes (it is not part of the public API).
const CLUSTER_PROTOS: &[&str] = &["boxoffice/cluster/v1/raft.proto"];

fn main() -> Result<(), Box<dyn Error>> {
    for proto in PROTOS.iter().chain(CLUSTER_PROTOS) {
        println!("cargo:rerun-if-changed={proto}");
    }
    println!("cargo:rerun-if-changed=build.rs");

    // Build scripts run in CARGO_MANIFEST_DIR, so "." is the crate directory.
    let fds = protox::compile(PROTOS, ["."])?;

    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(
        out_dir.join("boxoffice_descriptor.bin"),
        fds.encode_to_vec(),
    )?;

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(protox::compile(CLUSTER_PROTOS, ["."])?)?;
    Ok(())
}
