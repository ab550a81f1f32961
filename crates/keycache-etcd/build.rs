//! Nothing is generated here: this crate's build-dependency on
//! protoc-bin-vendored makes cargo fetch the protoc binary that
//! `tools/protoc` (named by `.cargo/config.toml`) hands etcd-client's build
//! script. Asking for its path checks that it exists for this platform.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if let Err(e) = protoc_bin_vendored::protoc_bin_path() {
        println!(
            "cargo:warning=no vendored protoc for this platform ({e}); a protoc on PATH is needed"
        );
    }
}
