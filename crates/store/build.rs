// `sqlx::migrate!` embeds the migrations directory's files; without this, cargo does not
// rebuild the crate when a migration is added, and the binary migrates to an old schema.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
