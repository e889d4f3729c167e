//! The PostgreSQL the tests use: a private cluster made exactly as
//! `flotilla up` makes one, shared by the tests of one process, and a fresh
//! database for each test.

use std::path::PathBuf;

use flotilla_server::embedded_pg::EmbeddedPostgres;
use tokio::sync::OnceCell;

static SHARED: OnceCell<EmbeddedPostgres> = OnceCell::const_new();

/// Where the shared cluster lives: under the target directory, so that it is
/// reused by the next run (start-up then takes a second, not ten) and
/// `cargo clean` removes it. `.ci/run` stops it after the suite.
pub fn shared_dir() -> PathBuf {
    // Short path: the socket path must fit in 108 bytes.
    let target = crate::bin_dir();
    let dir = target.join("e2e-pg");
    if dir.join("run").as_os_str().len() > 90 {
        return std::env::temp_dir().join("flotilla-e2e-pg");
    }
    dir
}

/// The shared cluster, started on first use.
pub async fn shared() -> &'static EmbeddedPostgres {
    SHARED
        .get_or_init(|| async {
            let dir = shared_dir();
            make_traversable_root(&dir);
            EmbeddedPostgres::start(&dir)
                .await
                .expect("starting the test PostgreSQL cluster (is PostgreSQL installed?)")
        })
        .await
}

fn make_traversable_root(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).expect("making the cluster directory");
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
}

/// A new, empty database in `pg`; returns its name.
pub async fn fresh_database(pg: &EmbeddedPostgres) -> String {
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    pg.ensure_database(&name)
        .await
        .expect("creating a test database");
    name
}

/// A new database in the shared cluster with the server's migrations
/// applied, and a pool on it: for tests that call the server's modules
/// directly, without a server process.
pub async fn migrated_database() -> sqlx::PgPool {
    let pg = shared().await;
    let name = fresh_database(pg).await;
    let db = flotilla_server::serve::connect(
        pg.connect_options(&name),
        std::time::Duration::from_secs(10),
    )
    .await
    .expect("connecting to a test database");
    flotilla_server::serve::migrate(&db)
        .await
        .expect("migrating a test database");
    db
}
