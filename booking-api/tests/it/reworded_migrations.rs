//! Migrations whose comments were reworded after release: a database that applied
//! them with their old text still starts (the server adopts the new checksums), and
//! one whose migration changed otherwise is still refused. Real Postgres.

use gpu_booking_api::server::{migrate, REWORDED_MIGRATIONS};
use gpu_booking_api::MIGRATOR;
use sha2::{Digest, Sha384};
use sqlx::PgPool;

/// sqlx's checksum of a migration is the SHA-384 of its file: what the old values
/// in `REWORDED_MIGRATIONS` were computed from.
#[test]
fn a_migrations_checksum_is_the_sha384_of_its_file() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
    for migration in MIGRATOR.iter() {
        let file = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .find(|f| {
                f.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{}_", migration.version))
            })
            .expect("the migration's file");
        let text = std::fs::read(file.path()).unwrap();
        assert_eq!(
            &Sha384::digest(&text)[..],
            migration.checksum.as_ref(),
            "{}",
            migration.version
        );
    }
    for (version, old) in REWORDED_MIGRATIONS {
        let current = MIGRATOR.iter().find(|m| m.version == version).unwrap();
        assert_ne!(
            hex::encode(current.checksum.as_ref()),
            old,
            "{version} was reworded"
        );
    }
}

async fn set_checksum(pool: &PgPool, version: i64, checksum: Vec<u8>) {
    sqlx::query("UPDATE _sqlx_migrations SET checksum = $1 WHERE version = $2")
        .bind(checksum)
        .bind(version)
        .execute(pool)
        .await
        .unwrap();
}

#[sqlx::test(migrations = "../migrations")]
async fn a_database_migrated_with_the_old_comments_starts(pool: PgPool) {
    // As a database migrated before the rewording holds them.
    for (version, old) in REWORDED_MIGRATIONS {
        set_checksum(&pool, version, hex::decode(old).unwrap()).await;
    }
    migrate(&pool).await.expect("the server starts on it");
    for (version, _) in REWORDED_MIGRATIONS {
        let stored: Vec<u8> =
            sqlx::query_scalar("SELECT checksum FROM _sqlx_migrations WHERE version = $1")
                .bind(version)
                .fetch_one(&pool)
                .await
                .unwrap();
        let current = MIGRATOR.iter().find(|m| m.version == version).unwrap();
        assert_eq!(stored, current.checksum.as_ref(), "{version}");
    }
    // A migration that changed in another way is still refused.
    let (version, _) = REWORDED_MIGRATIONS[0];
    set_checksum(&pool, version, vec![0; 48]).await;
    let refused = migrate(&pool)
        .await
        .expect_err("a changed migration is refused");
    assert!(format!("{refused:#}").contains("modified"), "{refused:#}");
}
