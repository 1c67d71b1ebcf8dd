//! The document: complete, and saying what the server checks.

use super::*;

fn settings() -> Settings {
    settings_with(&[])
}

fn settings_with(extra: &[(&str, &str)]) -> Settings {
    let mut pairs = vec![
        (
            "models.mock.base_url".to_owned(),
            "http://127.0.0.1:1/v1".to_owned(),
        ),
        ("models.mock.model".to_owned(), "m".to_owned()),
    ];
    pairs.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Settings::load_with(None, pairs, false).unwrap()
}

/// The schema at `pointer`, which must exist.
fn at<'a>(doc: &'a Value, pointer: &str) -> &'a Value {
    doc.pointer(pointer)
        .unwrap_or_else(|| panic!("nothing at {pointer}"))
}

/// The schema of an operation's parameter.
fn param<'a>(doc: &'a Value, path: &str, method: &str, name: &str) -> &'a Value {
    doc["paths"][path][method]["parameters"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name))
        .map(|p| &p["schema"])
        .unwrap_or_else(|| panic!("no parameter {name} of {method} {path}"))
}

#[test]
fn the_document_builds_and_every_operation_is_complete() {
    let doc = document(&settings());
    assert_eq!(doc["openapi"], "3.1.0");
    let mut operations = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            operations += 1;
            let responses = op["responses"].as_object().unwrap();
            for (status, r) in responses {
                let content = r["content"].as_object();
                assert!(
                    content.is_some_and(|c| c.values().all(|m| m["schema"].is_object())),
                    "{method} {path} {status} has a schema"
                );
            }
            if path.starts_with("/v1/") || path.starts_with("/admin/") {
                for s in ["401", "408", "422", "500", "503"] {
                    assert!(responses.contains_key(s), "{method} {path} documents {s}");
                }
                assert!(!op["security"].as_array().unwrap().is_empty());
            }
            if path.contains("{id}") {
                let id = op["parameters"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|p| p["name"] == "id")
                    .unwrap();
                assert_eq!(id["schema"]["format"], "uuid", "{method} {path}");
                assert!(responses.contains_key("404"));
            }
        }
    }
    assert_eq!(
        operations, 34,
        "the admin API is absent without api.admin_token"
    );
    let mut with_admin = settings();
    with_admin.api.admin_token = "0123456789abcdef".into();
    let doc = document(&with_admin);
    let admin: Vec<_> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(p, _)| p.starts_with("/admin/"))
        .flat_map(|(_, item)| item.as_object().unwrap().values())
        .collect();
    assert_eq!(admin.len(), 14);
    for op in admin {
        assert_eq!(op["security"], json!([{"admin": []}]));
        for s in ["401", "404", "422", "500"] {
            assert!(op["responses"].get(s).is_some(), "{op} documents {s}");
        }
    }
    assert_eq!(
        doc["components"]["schemas"]["AgentSpec"]["properties"]["model"]["enum"],
        json!(["mock"])
    );
}

#[test]
fn the_patterns_say_what_the_server_checks() {
    let user = regex_lite(&crate::schema::user_text_pattern());
    assert!(user("hi"));
    assert!(!user(" \t\u{3000}"));
    assert!(!user("a\u{0}"));
    assert!(user("\u{feff}"), "not white space for str::trim either");
    let url = regex_lite(&schema::tool_url_pattern(
        schema::HTTP_OR_HTTPS,
        schema::ANY_IPV4,
    ));
    for ok in [
        "http://tools.example/add",
        "HTTPS://Tools.Example:8443/a?b#c",
        "http://127.0.0.1:9000/t",
        "http://a-b.c-d.example",
    ] {
        assert!(url(ok), "{ok}");
        assert!(
            agentfleet_shared::domain::check_tool_url(ok).is_ok(),
            "{ok}"
        );
    }
    for bad in [
        "http://",
        "http://a.0/",
        "http://256.1.1.1/",
        "http://u:p@h/",
        "http://h/a b",
        "http://h:65536/",
        "ftp://h/",
    ] {
        assert!(!url(bad), "{bad}");
        assert!(
            agentfleet_shared::domain::check_tool_url(bad).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn the_rules_on_the_types_are_in_the_document() {
    use crate::routes::{batches, mcp_servers, runs, webhooks};
    let doc = document(&settings());
    let s = |p: &str| at(&doc, &format!("/components/schemas/{p}")).clone();
    let user = crate::schema::user_text_pattern();
    for p in ["CreateRun", "BatchItem", "ResumeBody"] {
        assert_eq!(
            s(&format!("{p}/properties/input/pattern")),
            json!(user),
            "{p}"
        );
    }
    for p in [
        "BatchItem/properties/custom_id",
        "AgentSpec/properties/system_prompt",
        "ToolSpec/properties/description",
        "DecisionBody/properties/tool_call_id",
        "DecisionBody/properties/reason",
        "CreateMcpServer/properties/description",
        "CreateWebhook/properties/description",
        "JsonObject/propertyNames",
    ] {
        assert_eq!(s(&format!("{p}/pattern")), json!(schema::NO_NUL), "{p}");
    }
    let max = |p: &str, key: &str| s(&format!("{p}/{key}")).as_u64().unwrap() as usize;
    assert_eq!(
        max("BatchItem/properties/custom_id", "maxLength"),
        batches::create::MAX_CUSTOM_ID_CHARS
    );
    assert_eq!(
        max("CreateMcpServer/properties/description", "maxLength"),
        mcp_servers::create::MAX_DESCRIPTION_CHARS
    );
    assert_eq!(
        max("CreateWebhook/properties/description", "maxLength"),
        webhooks::create::MAX_DESCRIPTION_CHARS
    );
    assert_eq!(
        max("ToolSpec/properties/url", "maxLength"),
        agentfleet_shared::domain::MAX_TOOL_URL_BYTES
    );
    assert_eq!(
        max("ToolSpec/properties/tools", "maxItems"),
        agentfleet_shared::domain::MAX_MCP_TOOL_PICKS
    );
    assert_eq!(
        s("JsonValue/anyOf/1/maximum"),
        json!(crate::validate::MAX_NUMBER)
    );
    assert_eq!(
        s("ToolSpec/properties/name/not/enum"),
        json!(agentfleet_shared::domain::BUILTIN_TOOLS)
    );
    for p in ["CreateWebhook", "RotateSecret"] {
        assert_eq!(
            s(&format!("{p}/properties/secret/pattern")),
            json!(webhooks::create::SECRET_PATTERN)
        );
    }
    assert_eq!(
        s("HeaderBody/properties/name/pattern"),
        json!(format!(
            "^[A-Za-z0-9!#$%&'*+.^_`|~-]{{1,{}}}$",
            mcp_servers::create::MAX_HEADER_NAME_BYTES
        ))
    );
    assert_eq!(s("ResumeBody/maxProperties"), json!(1));
    assert_eq!(s("ResumeRequest/allOf/1/minProperties"), json!(1));
    // The parameters.
    let cursor = json!(runs::list::CURSOR_PATTERN);
    assert_eq!(param(&doc, "/v1/runs", "get", "cursor")["pattern"], cursor);
    assert_eq!(
        param(&doc, "/v1/batches", "get", "before")["pattern"],
        cursor
    );
    let deliveries = "/v1/webhooks/{id}/deliveries";
    assert_eq!(param(&doc, deliveries, "get", "cursor")["pattern"], cursor);
    for (path, name) in [
        ("/v1/runs/{id}/events", "after"),
        ("/v1/threads/{id}/messages", "after"),
    ] {
        assert_eq!(
            param(&doc, path, "get", name)["maximum"],
            json!(crate::validate::MAX_ID)
        );
    }
    let key = param(&doc, "/v1/batches", "post", "Idempotency-Key");
    assert_eq!(key["maxLength"], json!(batches::create::MAX_KEY_CHARS));
    assert_eq!(param(&doc, "/v1/usage", "get", "from")["format"], "date");
    assert_eq!(
        param(&doc, "/v1/mcp-servers/{name}", "get", "name")["pattern"],
        json!("^[A-Za-z0-9_-]{1,64}$")
    );
}

#[test]
fn this_deployments_limits_are_in_the_document() {
    let settings = settings_with(&[
        ("api.max_input_bytes", "1000"),
        ("api.max_batch_items", "7"),
        ("api.max_page_size", "40"),
        ("api.default_page_size", "20"),
        ("mcp.max_headers", "3"),
        (
            "mcp.encryption_key",
            "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
        ),
    ]);
    let doc = document(&settings);
    let s = |p: &str| at(&doc, &format!("/components/schemas/{p}")).clone();
    let input = s("CreateRun/properties/input/description");
    assert!(
        input.as_str().unwrap().contains("at most 1000 bytes"),
        "{input}"
    );
    assert_eq!(s("SubmitBatch/properties/runs/maxItems"), json!(7));
    assert_eq!(s("CreateMcpServer/properties/headers/maxItems"), json!(3));
    let no_key = document(&settings_with(&[]));
    let headers = &no_key["components"]["schemas"]["CreateMcpServer"]["properties"]["headers"];
    assert_eq!(
        headers["maxItems"],
        json!(0),
        "no header is stored without a key"
    );
    assert_eq!(
        param(&doc, "/v1/runs", "get", "limit")["maximum"],
        json!(40)
    );
    // No address is listed for plain http: webhook URLs are https.
    let https = regex_lite(s("CreateWebhook/properties/url/pattern").as_str().unwrap());
    assert!(https("https://hooks.example/a") && !https("http://hooks.example/a"));
    let listed = document(&settings_with(&[("egress.allow", "10.0.0.0/8")]));
    let url = listed["components"]["schemas"]["CreateWebhook"]["properties"]["url"]["pattern"]
        .as_str()
        .unwrap();
    assert!(regex_lite(url)("http://10.1.2.3/hook"));
}

#[test]
fn the_secret_and_header_patterns_say_what_the_server_checks() {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    let pattern = regex_lite(crate::routes::webhooks::create::SECRET_PATTERN);
    for n in 0..=70usize {
        let bytes: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
        let secret = format!("whsec_{}", STANDARD.encode(&bytes));
        let ok = agentfleet_shared::store::webhooks::secret_key(&secret).is_ok();
        assert_eq!(pattern(&secret), ok, "{n} bytes: {secret}");
        // The unused bits of the last character set: not canonical base64, refused alike.
        if n % 3 != 0 {
            let mut odd = secret.trim_end_matches('=').to_owned();
            let last = odd.pop().unwrap();
            let i = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
                .find(last)
                .unwrap();
            odd.push(
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[i | 1] as char,
            );
            odd.push_str(&"=".repeat(secret.len() - secret.trim_end_matches('=').len()));
            let ok = agentfleet_shared::store::webhooks::secret_key(&odd).is_ok();
            assert_eq!(pattern(&odd), ok, "{odd}");
        }
    }
    for bad in [
        "whsec_",
        "whsec_AAAA",
        "whsec_",
        "wh_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    ] {
        assert!(!pattern(bad), "{bad}");
    }
    let doc = document(&settings());
    let name = &doc["components"]["schemas"]["HeaderBody"]["properties"]["name"];
    let token = regex_lite(name["pattern"].as_str().unwrap());
    let reserved = regex_lite(name["not"]["pattern"].as_str().unwrap());
    for h in crate::routes::mcp_servers::create::RESERVED_HEADERS {
        for spelling in [h.to_owned(), h.to_ascii_uppercase(), capitalized(h)] {
            assert!(token(&spelling) && reserved(&spelling), "{spelling}");
        }
    }
    for ok in ["Authorization", "X-Api-Key", "Hostname", "accept-language"] {
        assert!(token(ok) && !reserved(ok), "{ok}");
    }
}

fn capitalized(header: &str) -> String {
    header
        .split('-')
        .map(|w| w[..1].to_ascii_uppercase() + &w[1..])
        .collect::<Vec<_>>()
        .join("-")
}

/// Matches as JSON Schema validators do (ECMA-262 patterns), through `jsonschema`.
fn regex_lite(pattern: &str) -> impl Fn(&str) -> bool + use<> {
    let validator =
        jsonschema::validator_for(&json!({"type": "string", "pattern": pattern})).unwrap();
    move |s| validator.is_valid(&json!(s))
}

#[test]
fn the_literal_ipv4_hosts_of_the_document_are_those_the_egress_policy_allows() {
    use std::net::{IpAddr, Ipv4Addr};
    let pattern = format!("^{}$", agentfleet_shared::egress::public_ipv4_pattern());
    let public = regex_lite(&pattern);
    let check = |a: u8, b: u8, c: u8, d: u8| {
        let ip = Ipv4Addr::new(a, b, c, d);
        let allowed = agentfleet_shared::egress::is_public(IpAddr::V4(ip));
        assert_eq!(public(&ip.to_string()), allowed, "{ip}");
    };
    for a in 0..=255u8 {
        for b in 0..=255u8 {
            check(a, b, b.wrapping_mul(7), a.wrapping_mul(13));
        }
    }
    // Every /24 of the ranges refused within a /16.
    for (a, b) in [
        (192, 0),
        (192, 88),
        (198, 51),
        (203, 0),
        (100, 64),
        (172, 16),
    ] {
        for c in 0..=255u8 {
            check(a, b, c, 1);
        }
    }
    for bad in ["01.2.3.4", "1.2.3", "256.1.1.1", "1.2.3.4.5"] {
        assert!(!public(bad), "{bad}");
    }
    let doc = document(&settings());
    let url = regex_lite(
        doc["components"]["schemas"]["ToolSpec"]["properties"]["url"]["pattern"]
            .as_str()
            .unwrap(),
    );
    assert!(url("http://8.8.8.8:80/t") && url("http://tools.example/t"));
    assert!(!url("http://127.0.0.1/t") && !url("http://169.254.169.254/"));
}
