//! Who really sent a mail: the `Authentication-Results` (RFC 8601) the receiving server wrote.
//!
//! The rule (documented for operators in the channel docs):
//! - With a trusted `authserv_id` (the receiving MTA's name in its `Authentication-Results`),
//!   a mail is read only if the topmost header carrying that id says DMARC passed, or (with no
//!   DMARC failure) DKIM passed for a domain aligned with the `From:` domain, or SPF passed for
//!   an envelope sender aligned with it. No such header: refused. Headers with other ids are
//!   ignored (anyone can write them).
//! - With `sender_auth = "unchecked"` (a server that checks nothing), `From:` is taken as it
//!   is, but a mail whose `Authentication-Results` report a DMARC, DKIM or SPF failure for its
//!   `From:` domain is still refused.

/// How senders are authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SenderAuth {
    /// Trust the results of this authserv-id only, and require a pass.
    Trusted(String),
    /// The server checks nothing: accept `From:`, refuse reported failures.
    Unchecked,
}

/// One method's result: (method, result, properties).
pub type MethodResult = (String, String, Vec<(String, String)>);

/// One parsed `Authentication-Results` header.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Results {
    /// The authserv-id.
    pub id: String,
    /// (method, result, properties) in order.
    pub methods: Vec<MethodResult>,
}

fn strip_comments(s: &str) -> String {
    let mut depth = 0u32;
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// Parse one header value.
pub fn parse(value: &str) -> Results {
    let value = strip_comments(value);
    let mut parts = value.split(';');
    let id = parts
        .next()
        .and_then(|p| p.split_whitespace().next())
        .unwrap_or("")
        .to_ascii_lowercase();
    let mut methods = Vec::new();
    for p in parts {
        let mut words = p.split_whitespace();
        let Some(first) = words.next() else { continue };
        let Some((method, result)) = first.split_once('=') else {
            continue;
        };
        let props = words
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| {
                (
                    k.to_ascii_lowercase(),
                    v.trim_matches('"').to_ascii_lowercase(),
                )
            })
            .collect();
        let method = method.split('/').next().unwrap_or(method);
        methods.push((
            method.to_ascii_lowercase(),
            result.to_ascii_lowercase(),
            props,
        ));
    }
    Results { id, methods }
}

fn domain_of(addr: &str) -> &str {
    addr.rsplit_once('@').map_or(addr, |(_, d)| d)
}

/// Relaxed alignment: the same domain, or one a subdomain of the other.
fn aligned(a: &str, b: &str) -> bool {
    let (a, b) = (a.trim_end_matches('.'), b.trim_end_matches('.'));
    !a.is_empty()
        && !b.is_empty()
        && (a == b || a.ends_with(&format!(".{b}")) || b.ends_with(&format!(".{a}")))
}

impl Results {
    fn result_of<'a>(&'a self, method: &str) -> impl Iterator<Item = &'a MethodResult> {
        let method = method.to_string();
        self.methods.iter().filter(move |(m, _, _)| *m == method)
    }

    fn prop<'a>(props: &'a [(String, String)], key: &str) -> Option<&'a str> {
        props
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// A failure reported for mail from `from_domain`, if any.
    fn failure(&self, from_domain: &str) -> Option<String> {
        for (m, r, props) in &self.methods {
            let failed = matches!(r.as_str(), "fail" | "permerror");
            if !failed {
                continue;
            }
            let subject = match m.as_str() {
                "dmarc" => Self::prop(props, "header.from"),
                "dkim" => Self::prop(props, "header.d")
                    .or_else(|| Self::prop(props, "header.i").map(domain_of)),
                "spf" => Self::prop(props, "smtp.mailfrom").map(domain_of),
                _ => continue,
            };
            // A failure about another domain (a forwarder's signature) says nothing of From.
            if subject.is_none_or(|d| aligned(d, from_domain)) {
                return Some(format!("{m}={r}"));
            }
        }
        None
    }

    /// Whether it vouches for `from_domain`.
    fn passes(&self, from_domain: &str) -> bool {
        if self.result_of("dmarc").any(|(_, r, _)| r == "pass") {
            return true;
        }
        self.result_of("dkim").any(|(_, r, p)| {
            r == "pass"
                && Self::prop(p, "header.d")
                    .or_else(|| Self::prop(p, "header.i").map(domain_of))
                    .is_some_and(|d| aligned(d, from_domain))
        }) || self.result_of("spf").any(|(_, r, p)| {
            r == "pass"
                && Self::prop(p, "smtp.mailfrom")
                    .map(domain_of)
                    .is_some_and(|d| aligned(d, from_domain))
        })
    }
}

/// Whether a mail `From:` `from` with these `Authentication-Results` (topmost first) is read:
/// `Err` says why not.
///
/// # Errors
/// The reason for refusing it.
pub fn check(auth: &SenderAuth, headers: &[String], from: &str) -> Result<(), String> {
    let from_domain = domain_of(from).to_ascii_lowercase();
    let parsed: Vec<Results> = headers.iter().map(|h| parse(h)).collect();
    match auth {
        SenderAuth::Unchecked => {
            for r in &parsed {
                if let Some(f) = r.failure(&from_domain) {
                    return Err(format!("{} reported {f} for {from_domain}", r.id));
                }
            }
            Ok(())
        }
        SenderAuth::Trusted(id) => {
            let id = id.to_ascii_lowercase();
            let Some(r) = parsed.iter().find(|r| r.id == id) else {
                return Err(format!(
                    "no Authentication-Results from {id}: the sender of {from} is not verified"
                ));
            };
            if let Some(f) = r.failure(&from_domain) {
                return Err(format!("{id} reported {f} for {from_domain}"));
            }
            if r.passes(&from_domain) {
                Ok(())
            } else {
                Err(format!(
                    "{id} reported no passing DMARC, or DKIM/SPF aligned with {from_domain}"
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(id: &str) -> SenderAuth {
        SenderAuth::Trusted(id.into())
    }

    #[test]
    fn trusted_id_with_a_pass_is_read_and_everything_else_is_refused() {
        let pass = "mx.example.org; spf=pass smtp.mailfrom=alice@example.com; dkim=pass (ok) header.d=example.com; dmarc=pass header.from=example.com".to_string();
        assert_eq!(
            check(
                &t("mx.example.org"),
                std::slice::from_ref(&pass),
                "alice@example.com"
            ),
            Ok(())
        );
        // Forged by the sender with another id: ignored, so nothing vouches for it.
        assert!(check(&t("mx.other.net"), &[pass], "alice@example.com").is_err());
        let fail = "mx.example.org; spf=fail smtp.mailfrom=evil.test; dkim=none; dmarc=fail header.from=example.com".to_string();
        assert!(check(&t("mx.example.org"), &[fail], "alice@example.com").is_err());
        // DKIM pass for another domain is not alignment.
        let other = "mx.example.org; dkim=pass header.d=evil.test".to_string();
        assert!(check(&t("mx.example.org"), &[other], "alice@example.com").is_err());
        assert!(check(&t("mx.example.org"), &[], "alice@example.com").is_err());
    }

    #[test]
    fn unchecked_reads_from_unless_a_failure_is_reported() {
        assert_eq!(check(&SenderAuth::Unchecked, &[], "a@x.org"), Ok(()));
        let fail = "mx; dmarc=fail header.from=x.org".to_string();
        assert!(check(&SenderAuth::Unchecked, &[fail], "a@x.org").is_err());
        let other = "mx; dkim=fail header.d=list.example".to_string();
        assert_eq!(check(&SenderAuth::Unchecked, &[other], "a@x.org"), Ok(()));
    }
}
