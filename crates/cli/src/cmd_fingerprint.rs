//! `keyhold canonicalize` and `keyhold fingerprint`: the command-line face of
//! the `keyhold-fingerprint` crate, so anyone can reproduce the server's
//! canonical form and `Idempotency-Fingerprint` from a body on disk.
//!
//! Input is a file path, or standard input when the path is absent or `-`.
//! `canonicalize` writes the canonical bytes with no trailing newline, because
//! those exact bytes are what gets hashed (`keyhold canonicalize f | sha256sum`
//! must match). `fingerprint` prints the fingerprint followed by `\n`.
//!
//! Every failure is one line naming the broken rule, what and where, and the
//! input it came from, e.g.
//! `duplicate-name: duplicate member name "a" at byte 17 (input.json)`; the
//! binary prefixes `error: ` and exits 1.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use keyhold_fingerprint::{canonicalize_bytes, limits, parse, Error, Spec};

/// Name of the built-in orders spec on the command line; a spec file that
/// happens to be called `orders` must be given as `./orders`.
const BUILTIN_ORDERS: &str = "orders";

/// Label of standard input in error messages.
const STDIN_NAME: &str = "<stdin>";

/// Writes the RFC 8785 canonical form of the JSON document in `input` (or
/// standard input) to standard output, without a trailing newline.
pub fn canonicalize(input: Option<&Path>) -> Result<()> {
    let canonical = canonical_output(input)?;
    write_stdout(&canonical)
}

/// Prints the fingerprint of the JSON body in `input` (or standard input)
/// under `spec` (`orders` for the built-in spec, else a spec file), plus a
/// newline. With `hmac_key_env`, prints the keyed `hmac-sha256:` form using
/// the secret in that environment variable, which must be set and non-empty.
pub fn fingerprint(spec: &str, input: Option<&Path>, hmac_key_env: Option<&str>) -> Result<()> {
    let secret = hmac_key_env.map(read_secret).transpose()?;
    let line = fingerprint_output(spec, input, secret.as_deref())?;
    write_stdout(line.as_bytes())
}

fn canonical_output(input: Option<&Path>) -> Result<Vec<u8>> {
    let (name, bytes) = read_input(input, limits::INPUT_BYTES_MAX)?;
    canonicalize_bytes(&bytes).map_err(|e| one_line(&e, &name))
}

fn fingerprint_output(spec: &str, input: Option<&Path>, secret: Option<&[u8]>) -> Result<String> {
    let spec = load_spec(spec)?;
    let (name, bytes) = read_input(input, limits::INPUT_BYTES_MAX)?;
    let body = parse(&bytes).map_err(|e| one_line(&e, &name))?;
    let fingerprint = match secret {
        Some(secret) => spec.fingerprint_hmac(secret, &body),
        None => spec.fingerprint(&body),
    };
    Ok(format!("{fingerprint}\n"))
}

fn load_spec(spec: &str) -> Result<Spec> {
    if spec == BUILTIN_ORDERS {
        return Ok(Spec::orders());
    }
    let (name, bytes) = read_input(Some(Path::new(spec)), limits::SPEC_BYTES_MAX)?;
    Spec::from_json(&bytes).map_err(|e| one_line(&e, &name))
}

fn read_secret(var: &str) -> Result<Vec<u8>> {
    match std::env::var(var) {
        Ok(secret) if !secret.is_empty() => Ok(secret.into_bytes()),
        Ok(_) => bail!("HMAC secret environment variable {var} is empty"),
        Err(std::env::VarError::NotPresent) => {
            bail!("HMAC secret environment variable {var} is not set")
        }
        Err(std::env::VarError::NotUnicode(_)) => {
            bail!("HMAC secret environment variable {var} is not valid UTF-8")
        }
    }
}

/// Reads at most one byte more than `bytes_max`, so an oversized input is
/// reported by the parser's size rule without being held in memory whole.
fn read_input(input: Option<&Path>, bytes_max: usize) -> Result<(String, Vec<u8>)> {
    let limit = u64::try_from(bytes_max)
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    let mut bytes = Vec::new();
    match input {
        None => read_stdin(limit, &mut bytes).map(|()| STDIN_NAME.to_owned()),
        Some(path) if path.as_os_str() == "-" => {
            read_stdin(limit, &mut bytes).map(|()| STDIN_NAME.to_owned())
        }
        Some(path) => {
            let name = path.display().to_string();
            File::open(path)
                .and_then(|file| file.take(limit).read_to_end(&mut bytes))
                .with_context(|| format!("reading {name}"))?;
            Ok(name)
        }
    }
    .map(|name| (name, bytes))
}

fn read_stdin(limit: u64, bytes: &mut Vec<u8>) -> Result<()> {
    io::stdin()
        .lock()
        .take(limit)
        .read_to_end(bytes)
        .context("reading standard input")?;
    Ok(())
}

/// `rule: message (input)`: one line, so `{e:#}` adds no chain after it.
fn one_line(e: &Error, name: &str) -> anyhow::Error {
    anyhow!("{}: {e} ({name})", e.rule())
}

fn write_stdout(bytes: &[u8]) -> Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .context("writing to standard output")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(content: &[u8]) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(content).unwrap();
        file
    }

    #[test]
    fn canonical_bytes_have_no_trailing_newline() {
        let file = temp(b"{ \"b\": 1.0, \"a\": [true, -0] }\n");
        assert_eq!(
            canonical_output(Some(file.path())).unwrap(),
            br#"{"a":[true,0],"b":1}"#
        );
    }

    #[test]
    fn errors_are_one_line_with_rule_place_and_file() {
        let file = temp(br#"{"a":1,"b":2,"a":3}"#);
        let e = canonical_output(Some(file.path())).unwrap_err();
        assert_eq!(
            format!("{e:#}"),
            format!(
                "duplicate-name: duplicate member name \"a\" at byte 13 ({})",
                file.path().display()
            )
        );
        let e = canonical_output(Some(Path::new("/nonexistent/body.json"))).unwrap_err();
        assert!(
            format!("{e:#}").starts_with("reading /nonexistent/body.json: "),
            "{e:#}"
        );
    }

    #[test]
    fn orders_fingerprint_and_spec_files() {
        let body = temp(br#"{"amount":1999,"currency":"EUR","metadata":{"x":1}}"#);
        let plain = fingerprint_output("orders", Some(body.path()), None).unwrap();
        assert!(
            plain.starts_with("sha256:") && plain.ends_with('\n'),
            "{plain}"
        );
        let spec = temp(Spec::orders().to_json().as_bytes());
        let from_file =
            fingerprint_output(spec.path().to_str().unwrap(), Some(body.path()), None).unwrap();
        assert_eq!(from_file, plain);
        let keyed = fingerprint_output("orders", Some(body.path()), Some(b"k")).unwrap();
        assert!(keyed.starts_with("hmac-sha256:"), "{keyed}");

        let bad = temp(br#"{"operation":"o","version":1,"include":["x"]}"#);
        let e =
            fingerprint_output(bad.path().to_str().unwrap(), Some(body.path()), None).unwrap_err();
        let line = format!("{e:#}");
        assert!(
            line.starts_with("spec: invalid fingerprint spec at \"/include/0\""),
            "{line}"
        );
        assert!(
            line.ends_with(&format!("({})", bad.path().display())),
            "{line}"
        );
    }

    #[test]
    fn missing_hmac_secret_is_an_error() {
        let e = read_secret("KEYHOLD_TEST_SURELY_UNSET_VARIABLE_7f3a").unwrap_err();
        assert_eq!(
            e.to_string(),
            "HMAC secret environment variable KEYHOLD_TEST_SURELY_UNSET_VARIABLE_7f3a is not set"
        );
    }
}
