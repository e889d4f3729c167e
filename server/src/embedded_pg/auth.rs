//! Who may log in to the private cluster, with SCRAM passwords in 0600 files.
//!
//! The cluster accepts only `scram-sha-256` logins on its socket
//! (`pg_hba.conf`). Two roles log in: the bootstrap superuser `postgres`,
//! which only creates databases and roles, and [`OWNER`], which owns the
//! flotilla databases and is what the server connects as; it is no
//! superuser, so a leaked connection cannot read files, run programs or
//! change roles. Each password is in `DIR/secrets/ROLE.password`, 0600 in a
//! 0700 directory of the user that runs flotilla.
//!
//! Clusters made before this trusted every local connection. [`upgrade`]
//! finds such a `pg_hba.conf`, sets the superuser's password, rewrites the
//! file and reloads the configuration; [`hand_over`] gives an old database
//! (owned by `postgres`) and everything in its `public` schema to [`OWNER`].

use std::io::Write;
use std::path::{Path, PathBuf};

use sqlx::PgConnection;

use super::{io_err, EmbeddedPgError};

/// The bootstrap superuser (`initdb -U`).
pub const SUPERUSER: &str = "postgres";

/// The role the server connects as: owner of the flotilla databases, not a
/// superuser.
pub const OWNER: &str = "flotilla";

/// The `pg_hba.conf` flotilla writes: password logins on the socket, no
/// TCP (the server listens on none: `listen_addresses=''`).
const HBA: &str = "\
# Written by flotilla: SCRAM password logins on the private socket only.
# TYPE  DATABASE  USER  METHOD
local   all       all   scram-sha-256
";

/// The two passwords, read from (or first written to) `DIR/secrets`.
#[derive(Clone)]
pub struct Secrets {
    pub dir: PathBuf,
    pub superuser: String,
    pub owner: String,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Secrets {
    /// Reads both password files in `dir`, making any that is missing with
    /// a fresh password; `dir` is made 0700.
    pub fn load_or_make(dir: &Path) -> Result<Self, EmbeddedPgError> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io_err(dir))?;
        Ok(Secrets {
            dir: dir.to_path_buf(),
            superuser: read_or_make(&password_file(dir, SUPERUSER))?,
            owner: read_or_make(&password_file(dir, OWNER))?,
        })
    }

    /// Where `role`'s password is kept.
    pub fn file(&self, role: &str) -> PathBuf {
        password_file(&self.dir, role)
    }
}

fn password_file(dir: &Path, role: &str) -> PathBuf {
    dir.join(format!("{role}.password"))
}

/// Reads the password in `path`, or writes a fresh one there (0600). Two
/// processes starting at once agree: the file appears whole, by a hard link
/// that fails if it exists, and the loser reads the winner's.
fn read_or_make(path: &Path) -> Result<String, EmbeddedPgError> {
    use std::os::unix::fs::OpenOptionsExt;
    if !path.exists() {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let mut bytes = [0u8; 24];
        rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut bytes);
        let password = hex::encode(bytes);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_err(&tmp))?;
        writeln!(f, "{password}")
            .and_then(|()| f.sync_all())
            .map_err(io_err(&tmp))?;
        let linked = std::fs::hard_link(&tmp, path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => return Ok(password),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err(path)(e)),
        }
    }
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    let password = text.trim().to_string();
    if password.is_empty() {
        return Err(io_err(path)(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the password file is empty",
        )));
    }
    Ok(password)
}

/// True unless every rule of `pg_hba.conf` asks for a SCRAM password
/// (clusters made before trusted every local connection).
pub fn hba_needs_rewrite(hba: &Path) -> Result<bool, EmbeddedPgError> {
    let text = std::fs::read_to_string(hba).map_err(io_err(hba))?;
    let rules = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty());
    let mut any = false;
    for rule in rules {
        any = true;
        if !rule.split_whitespace().any(|f| f == "scram-sha-256") {
            return Ok(true);
        }
    }
    Ok(!any)
}

/// Replaces `pg_hba.conf` with [`HBA`], owned by `owner` (the cluster's
/// user) and readable by it only.
pub fn write_hba(hba: &Path, owner: Option<(u32, u32)>) -> Result<(), EmbeddedPgError> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = hba.with_extension(format!("conf.tmp{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io_err(&tmp))?;
    f.write_all(HBA.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(io_err(&tmp))?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(&tmp, Some(uid), Some(gid)).map_err(io_err(&tmp))?;
    }
    std::fs::rename(&tmp, hba).map_err(io_err(hba))
}

/// A string literal for SQL (the passwords are hex, but quote anyway).
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Sets `role`'s password, stored as a SCRAM verifier whatever the
/// server's default (`md5` before PostgreSQL 14).
pub async fn set_password(
    conn: &mut PgConnection,
    role: &str,
    password: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("SET password_encryption = 'scram-sha-256'")
        .execute(&mut *conn)
        .await?;
    let sql = format!(
        "ALTER ROLE \"{role}\" WITH LOGIN PASSWORD {}",
        literal(password)
    );
    execute_retrying(conn, &sql).await
}

/// Makes [`OWNER`] (if missing) a login role that is not a superuser and
/// cannot create roles or databases, with `password`.
pub async fn ensure_owner(conn: &mut PgConnection, password: &str) -> Result<(), sqlx::Error> {
    // Another process may create it at the same moment: that is fine.
    let created = sqlx::query(&format!("CREATE ROLE \"{OWNER}\" LOGIN"))
        .execute(&mut *conn)
        .await;
    match created {
        Ok(_) => {}
        Err(e) if sql_state(&e).is_some_and(|c| c == "42710" || c == "23505") => {}
        Err(e) => return Err(e),
    }
    let sql = format!(
        "ALTER ROLE \"{OWNER}\" WITH NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"
    );
    execute_retrying(conn, &sql).await?;
    set_password(conn, OWNER, password).await
}

/// Gives [`OWNER`] what an older flotilla made as the superuser in the
/// database `conn` is connected to: every table, view, sequence, function
/// and type in `public`, so migrations (run as [`OWNER`]) may alter them.
pub async fn hand_over(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    // Sequences owned by a column (serial, identity) follow their table and
    // cannot be given away alone; a table's row type follows the table.
    let sql = format!(
        r#"DO $$
DECLARE r record;
BEGIN
  FOR r IN
    SELECT c.oid::regclass::text AS name,
           CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                          WHEN 'S' THEN 'SEQUENCE' WHEN 'f' THEN 'FOREIGN TABLE'
                          ELSE 'TABLE' END AS kind
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
      AND c.relowner <> '{OWNER}'::regrole
      AND NOT (c.relkind = 'S' AND EXISTS (
        SELECT 1 FROM pg_depend d
        WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype IN ('a', 'i')))
  LOOP
    EXECUTE format('ALTER %s %s OWNER TO "{OWNER}"', r.kind, r.name);
  END LOOP;
  FOR r IN
    SELECT p.oid::regprocedure::text AS name
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = 'public' AND p.proowner <> '{OWNER}'::regrole
  LOOP
    EXECUTE format('ALTER ROUTINE %s OWNER TO "{OWNER}"', r.name);
  END LOOP;
  FOR r IN
    SELECT t.oid::regtype::text AS name
    FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
    WHERE n.nspname = 'public' AND t.typowner <> '{OWNER}'::regrole
      AND t.typtype IN ('e', 'd', 'r') AND t.typelem = 0
  LOOP
    EXECUTE format('ALTER TYPE %s OWNER TO "{OWNER}"', r.name);
  END LOOP;
END $$"#
    );
    sqlx::query(&sql).execute(&mut *conn).await.map(drop)
}

/// The SQLSTATE of a database error.
pub fn sql_state(e: &sqlx::Error) -> Option<String> {
    match e {
        sqlx::Error::Database(d) => d.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// True for a refused login: a wrong password (28P01) or an unknown role
/// or database the rules reject (28000).
pub fn is_login_refused(e: &sqlx::Error) -> bool {
    sql_state(e).is_some_and(|c| c == "28P01" || c == "28000")
}

/// Runs `sql`, again when another session changed the same catalog row at
/// the same moment (`tuple concurrently updated`, XX000), which two
/// processes starting on one cluster can cause.
async fn execute_retrying(conn: &mut PgConnection, sql: &str) -> Result<(), sqlx::Error> {
    let mut tries = 0;
    loop {
        match sqlx::query(sql).execute(&mut *conn).await {
            Err(e) if tries < 5 && sql_state(&e).is_some_and(|c| c == "XX000") => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(50 * tries)).await;
            }
            r => return r.map(drop),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_rules_need_a_rewrite_and_ours_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let hba = dir.path().join("pg_hba.conf");
        std::fs::write(
            &hba,
            "# comment\nlocal all all trust\nhost all all 127.0.0.1/32 trust\n",
        )
        .unwrap();
        assert!(hba_needs_rewrite(&hba).unwrap());
        write_hba(&hba, None).unwrap();
        assert!(!hba_needs_rewrite(&hba).unwrap());
        std::fs::write(&hba, "local all all scram-sha-256 # ok\n").unwrap();
        assert!(!hba_needs_rewrite(&hba).unwrap());
        std::fs::write(&hba, "local all all peer\n").unwrap();
        assert!(hba_needs_rewrite(&hba).unwrap());
    }

    #[test]
    fn passwords_are_made_once_and_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let secrets = dir.path().join("secrets");
        let a = Secrets::load_or_make(&secrets).unwrap();
        let b = Secrets::load_or_make(&secrets).unwrap();
        assert_eq!(a.superuser, b.superuser);
        assert_eq!(a.owner, b.owner);
        assert_ne!(a.superuser, a.owner);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&secrets), 0o700);
        assert_eq!(mode(&a.file(OWNER)), 0o600);
        assert_eq!(mode(&a.file(SUPERUSER)), 0o600);
        assert!(!format!("{a:?}").contains(&a.owner));
    }
}
