//! The files of `--dir` (a projected volume the kubelet keeps current): read bounded, and only
//! regular files (a FIFO or a device there would block or never end). Every failure is a
//! message, never a panic.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The service-account token's largest size.
pub const MAX_TOKEN: u64 = 16 * 1024;
/// A CA file's largest size.
pub const MAX_CA: u64 = 64 * 1024;
/// The CA file of the ConfigMap `safe-termination-wait`, read first.
pub const CA_FILE: &str = "ca.crt";
/// The CA file written at admission, read when [`CA_FILE`] gives no certificate.
pub const ADMISSION_CA_FILE: &str = "ca-admission.crt";
/// `<NAME>.preStopSeconds`'s largest size (an integer and some whitespace).
pub const MAX_SECONDS_FILE: u64 = 64;
/// The largest sleep the operator computes for a policy.
pub const MAX_PRESTOP_SECONDS: u64 = 3600;

/// At most `limit` bytes of the regular file at `path`; a larger one is an error.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, String> {
    // O_NONBLOCK: opening a FIFO for reading would block until a writer comes; it is not a
    // regular file and is refused below anyway. Regular files ignore the flag.
    let file = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path).map_err(|e| io_reason(&e))?;
    let meta = file.metadata().map_err(|e| io_reason(&e))?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let mut bytes = Vec::with_capacity(meta.len().min(limit) as usize);
    (&file as &File).take(limit + 1).read_to_end(&mut bytes).map_err(|e| io_reason(&e))?;
    if bytes.len() as u64 > limit {
        return Err(format!("larger than {limit} bytes"));
    }
    Ok(bytes)
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "missing".into(),
        _ => e.to_string(),
    }
}

/// The token: trimmed, not empty, only what an HTTP header value and a JWT may hold.
pub fn parse_token(bytes: &[u8]) -> Result<String, String> {
    let token = bytes.trim_ascii();
    if token.is_empty() {
        return Err("empty".into());
    }
    if !token.iter().all(|b| b.is_ascii_graphic()) {
        return Err("not printable ASCII".into());
    }
    // checked ASCII above
    Ok(String::from_utf8_lossy(token).into_owned())
}

/// The CA to verify the operator with, as `parse` reads it (it fails when the file holds no
/// usable certificate): from `dir/ca.crt`, else from `dir/ca-admission.crt`; an error naming
/// both files, with why each gave none, when neither gives one.
///
/// `ca.crt` comes from the ConfigMap the operator keeps current in each namespace with a `Wait`
/// policy (it follows CA rotation), so it is preferred. `ca-admission.crt` is the CA written on
/// the pod at admission, projected by the downward API from the pod annotation
/// `safetermination.io/wait-ca`: namespaces served by the cluster's default policy have no
/// ConfigMap (the projection is optional: no `ca.crt` at all), and the downward API gives an
/// empty file when the annotation is absent. So a missing, empty or certificate-less `ca.crt`
/// (or one that cannot be read: too large, not a regular file) turns to `ca-admission.crt`;
/// both read with the same bounds ([`MAX_CA`], a regular file, a non-blocking open).
pub fn read_ca<T>(dir: &Path, parse: impl Fn(&[u8]) -> Result<T, String>) -> Result<T, String> {
    let read = |name: &str| {
        let bytes = read_bounded(&dir.join(name), MAX_CA)?;
        if bytes.trim_ascii().is_empty() {
            return Err("empty".to_string());
        }
        parse(&bytes)
    };
    read(CA_FILE).or_else(|ca| read(ADMISSION_CA_FILE).map_err(|admission| format!("{CA_FILE}: {ca}; {ADMISSION_CA_FILE}: {admission}")))
}

/// `<NAME>.preStopSeconds`: an integer 0..=3600 once trimmed.
pub fn parse_seconds(bytes: &[u8]) -> Result<u64, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("not an integer: {:?}", crate::machine::short(text)));
    }
    match text.parse::<u64>() {
        Ok(n) if n <= MAX_PRESTOP_SECONDS => Ok(n),
        _ => Err(format!("not in 0..={MAX_PRESTOP_SECONDS}: {}", crate::machine::short(text))),
    }
}

/// The policy's current sleep from `dir/<name>.preStopSeconds`, or the reason it has none. A
/// current sleep of 0 s (a policy with `minSeconds: 0` sized to nothing after the pod's
/// admission) counts as none: the fallback is for doubt, and the admission's sleep, which was
/// above 0 (a 0 s sleep injects nothing), is kept rather than wait zero.
pub fn current_seconds(dir: &Path, policy: &str) -> Result<u64, String> {
    let path = dir.join(format!("{policy}.preStopSeconds"));
    match read_bounded(&path, MAX_SECONDS_FILE).and_then(|b| parse_seconds(&b))? {
        0 => Err("0 s: the admission's sleep is kept".into()),
        s => Ok(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fresh directory under the system's temporary one, removed on drop.
    struct TempDir(PathBuf);
    impl TempDir {
        fn new(name: &str) -> TempDir {
            let p = std::env::temp_dir().join(format!("st-wait-unit-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn bounded_reads() {
        let d = TempDir::new("bounded");
        let f = d.0.join("f");
        std::fs::write(&f, vec![b'a'; 100]).unwrap();
        assert_eq!(read_bounded(&f, 100).unwrap().len(), 100);
        assert_eq!(read_bounded(&f, 99), Err("larger than 99 bytes".into()));
        assert_eq!(read_bounded(&d.0.join("nope"), 100), Err("missing".into()));
        assert_eq!(read_bounded(&d.0, 100), Err("not a regular file".into()));
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let d = TempDir::new("fifo");
        let f = d.0.join("fifo");
        let c = std::ffi::CString::new(f.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(read_bounded(&f, 100), Err("not a regular file".into()));
    }

    /// A stand-in for the PEM parser: a "certificate" is a line `CERT <name>`.
    fn parse_stub(bytes: &[u8]) -> Result<String, String> {
        let text = String::from_utf8_lossy(bytes);
        text.trim().strip_prefix("CERT ").map(str::to_string).ok_or_else(|| "no usable certificate".to_string())
    }

    #[test]
    fn ca_from_the_config_map_else_from_admission() {
        let d = TempDir::new("ca");
        let (ca, admission) = (d.0.join(CA_FILE), d.0.join(ADMISSION_CA_FILE));
        let set = |path: &Path, content: Option<&[u8]>| match content {
            Some(c) => std::fs::write(path, c).unwrap(),
            None => {
                let _ = std::fs::remove_file(path);
            }
        };
        let big = vec![b'x'; MAX_CA as usize + 1];
        let at_most = [b"CERT edge".to_vec(), vec![b' '; MAX_CA as usize - 9]].concat();
        // (ca.crt, ca-admission.crt: None for no file; what read_ca gives)
        type Case<'a> = (Option<&'a [u8]>, Option<&'a [u8]>, Result<&'a str, &'a str>);
        let cases: &[Case] = &[
            // ca.crt first, whatever ca-admission.crt holds
            (Some(b"CERT current\n"), Some(b"CERT admission\n"), Ok("current")),
            (Some(b"CERT current\n"), None, Ok("current")),
            (Some(b"CERT current\n"), Some(b""), Ok("current")),
            (Some(&at_most), None, Ok("edge")),
            // a default-policy namespace: no ConfigMap, the annotation's CA
            (None, Some(b"CERT admission\n"), Ok("admission")),
            (Some(b""), Some(b"CERT admission\n"), Ok("admission")),
            (Some(b" \n\t"), Some(b"CERT admission\n"), Ok("admission")),
            (Some(b"garbage"), Some(b"CERT admission\n"), Ok("admission")),
            (Some(&big), Some(b"CERT admission\n"), Ok("admission")),
            // neither: a doubt naming both
            (None, None, Err("ca.crt: missing; ca-admission.crt: missing")),
            (Some(b""), Some(b""), Err("ca.crt: empty; ca-admission.crt: empty")),
            (None, Some(b"\n"), Err("ca.crt: missing; ca-admission.crt: empty")),
            (Some(b"garbage"), Some(b"garbage"), Err("ca.crt: no usable certificate; ca-admission.crt: no usable certificate")),
            (Some(b""), Some(&big), Err("ca.crt: empty; ca-admission.crt: larger than 65536 bytes")),
        ];
        for (i, (ca_content, admission_content, want)) in cases.iter().enumerate() {
            set(&ca, *ca_content);
            set(&admission, *admission_content);
            assert_eq!(read_ca(&d.0, parse_stub), want.map(str::to_string).map_err(str::to_string), "case {i}");
        }
    }

    #[test]
    fn a_ca_fifo_is_passed_over_without_blocking() {
        let d = TempDir::new("cafifo");
        for name in [CA_FILE, ADMISSION_CA_FILE] {
            let c = std::ffi::CString::new(d.0.join(name).to_str().unwrap()).unwrap();
            // SAFETY: a valid NUL-terminated path
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        }
        assert_eq!(read_ca(&d.0, parse_stub), Err("ca.crt: not a regular file; ca-admission.crt: not a regular file".into()));
        std::fs::remove_file(d.0.join(ADMISSION_CA_FILE)).unwrap();
        std::fs::write(d.0.join(ADMISSION_CA_FILE), "CERT admission").unwrap();
        assert_eq!(read_ca(&d.0, parse_stub), Ok("admission".into()));
    }

    #[test]
    fn tokens() {
        assert_eq!(parse_token(b"  eyJhbGciOi.x-y_z\n"), Ok("eyJhbGciOi.x-y_z".into()));
        assert_eq!(parse_token(b" \n"), Err("empty".into()));
        assert_eq!(parse_token(b"a b"), Err("not printable ASCII".into()));
        assert_eq!(parse_token("é".as_bytes()), Err("not printable ASCII".into()));
        assert_eq!(parse_token(b"a\r\nX-Evil: 1"), Err("not printable ASCII".into()));
    }

    #[test]
    fn seconds() {
        assert_eq!(parse_seconds(b"17\n"), Ok(17));
        assert_eq!(parse_seconds(b" 0 "), Ok(0));
        assert_eq!(parse_seconds(b"3600"), Ok(3600));
        assert_eq!(parse_seconds(b"3601"), Err("not in 0..=3600: 3601".into()));
        assert_eq!(parse_seconds(b"99999999999999999999999"), Err("not in 0..=3600: 99999999999999999999999".into()));
        assert_eq!(parse_seconds(b"-1"), Err("not an integer: \"-1\"".into()));
        assert_eq!(parse_seconds(b"+5"), Err("not an integer: \"+5\"".into()));
        assert_eq!(parse_seconds(b"1.5"), Err("not an integer: \"1.5\"".into()));
        assert_eq!(parse_seconds(b""), Err("not an integer: \"\"".into()));
        assert_eq!(parse_seconds(&[0xff, b'1']), Err("not UTF-8".into()));
    }

    #[test]
    fn current_seconds_from_the_policy_file() {
        let d = TempDir::new("current");
        std::fs::write(d.0.join("web.preStopSeconds"), "12\n").unwrap();
        std::fs::write(d.0.join("bad.preStopSeconds"), "twelve").unwrap();
        std::fs::write(d.0.join("big.preStopSeconds"), vec![b'1'; 65]).unwrap();
        assert_eq!(current_seconds(&d.0, "web"), Ok(12));
        assert_eq!(current_seconds(&d.0, "bad"), Err("not an integer: \"twelve\"".into()));
        assert_eq!(current_seconds(&d.0, "big"), Err("larger than 64 bytes".into()));
        assert_eq!(current_seconds(&d.0, "none"), Err("missing".into()));
        std::fs::write(d.0.join("zero.preStopSeconds"), "0").unwrap();
        assert_eq!(current_seconds(&d.0, "zero"), Err("0 s: the admission's sleep is kept".into()), "never a fallback of zero");
    }
}
