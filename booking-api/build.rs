fn main() {
    // sqlx::migrate! embeds the migrations: rebuild when one is added or edited.
    println!("cargo:rerun-if-changed=../migrations");
}
