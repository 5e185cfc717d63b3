//! Keeping secrets out of logs and error messages.

/// A URL with its password (or whole userinfo) replaced, for display.
pub fn url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    // Userinfo ends at the last '@' before the path.
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            let masked = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                "***".to_owned()
            };
            let tail = query_without_password(tail);
            format!("{scheme}://{masked}@{host}{tail}")
        }
        None => format!("{scheme}://{authority}{}", query_without_password(tail)),
    }
}

/// Hides `password=` query parameters (libpq URLs accept them).
fn query_without_password(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_owned();
    };
    let parts: Vec<String> = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
            _ => kv.to_owned(),
        })
        .collect();
    format!("{path}?{}", parts.join("&"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn hides_passwords() {
        assert_eq!(
            super::url("postgres://app:s3cret@db:5432/x"),
            "postgres://app:***@db:5432/x"
        );
        assert_eq!(super::url("nats://tok3n@h:4222"), "nats://***@h:4222");
        assert_eq!(super::url("redis://h:6379"), "redis://h:6379");
        assert_eq!(
            super::url("postgresql://h/db?user=a&password=s3cret&sslmode=require"),
            "postgresql://h/db?user=a&password=***&sslmode=require"
        );
        assert_eq!(
            super::url("postgres://u:p@ss@h/db"),
            "postgres://u:***@h/db"
        );
    }
}
