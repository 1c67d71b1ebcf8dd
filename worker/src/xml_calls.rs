//! Tool calls for models without native ones (`models.<name>.tool_calling = "xml"`): the
//! tools are described in the system prompt, and calls are written in the answer's text as
//!
//! ```text
//! <function_calls>
//! <invoke name="get_weather">
//! <parameter name="city">Paris</parameter>
//! <parameter name="days">3</parameter>
//! </invoke>
//! </function_calls>
//! ```
//!
//! [`XmlCalls`] takes the streamed text piece by piece: what lies outside the blocks is
//! forwarded to clients (a piece that may be the start of `<function_calls>` is held back
//! until the next one decides), the blocks become [`ModelToolCall`]s. The stored history stays
//! native (content plus `tool_calls`), so confirmation, idempotency and events are those of
//! native calls; [`to_xml_history`] renders it for the model. No I/O: every rule is tested
//! below.

use serde_json::{Map, Value};

#[cfg(test)]
use crate::model_stream::DEFAULT_MAX_TOOL_CALLS;
use crate::model_stream::ModelToolCall;

const OPEN: &str = "<function_calls>";
const CLOSE: &str = "</function_calls>";
/// The stream's text, split into what clients see and the calls.
pub struct XmlCalls {
    /// Calls one response may make (`worker.max_tool_calls_per_response`); more is a
    /// malformed response.
    max_calls: usize,
    /// Text not yet forwarded (a possible opening tag) or a block not yet closed.
    pending: String,
    /// Inside `<function_calls>`.
    in_block: bool,
    /// Where to look for the closing tag next (the block's text before it was searched).
    searched: usize,
    visible: String,
    calls: Vec<ModelToolCall>,
    error: Option<String>,
}

impl XmlCalls {
    pub fn new(max_calls: usize) -> XmlCalls {
        XmlCalls {
            max_calls,
            pending: String::new(),
            in_block: false,
            searched: 0,
            visible: String::new(),
            calls: Vec::new(),
            error: None,
        }
    }

    /// Takes one piece of streamed text; returns the part clients may see now.
    pub fn feed(&mut self, text: &str) -> String {
        self.pending.push_str(text);
        let mut out = String::new();
        // What this call consumed of `pending`, drained once at the end: draining after each
        // block moved the rest of the piece every time, quadratic in a piece full of blocks.
        let mut start = 0;
        loop {
            let rest = &self.pending[start..];
            if self.in_block {
                let from = self.searched.min(rest.len());
                let Some(at) = rest[from..].find(CLOSE).map(|i| i + from) else {
                    // Next time, search only what may hold a tag cut by this piece's end.
                    self.searched = rest.len().saturating_sub(CLOSE.len());
                    while !rest.is_char_boundary(self.searched) {
                        self.searched -= 1;
                    }
                    break;
                };
                if self.error.is_none()
                    && let Err(e) = parse_block(&rest[..at], &mut self.calls, self.max_calls)
                {
                    self.error = Some(e);
                }
                start += at + CLOSE.len();
                self.in_block = false;
                self.searched = 0;
                continue;
            }
            if let Some(at) = rest.find(OPEN) {
                out.push_str(&rest[..at]);
                start += at + OPEN.len();
                self.in_block = true;
                continue;
            }
            // Hold back the longest end that could start the opening tag.
            let keep = (1..OPEN.len().min(rest.len() + 1))
                .rev()
                .find(|&n| {
                    let from = rest.len() - n;
                    rest.is_char_boundary(from) && OPEN.starts_with(&rest[from..])
                })
                .unwrap_or(0);
            let cut = rest.len() - keep;
            out.push_str(&rest[..cut]);
            start += cut;
            break;
        }
        self.pending.drain(..start);
        self.visible.push_str(&out);
        out
    }

    /// At the stream's end: the rest of the visible text (to forward), the whole visible
    /// text, and the calls; or what made the response malformed.
    pub fn finish(mut self) -> Result<(String, String, Vec<ModelToolCall>), String> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if self.in_block {
            return Err("an unclosed <function_calls> block".into());
        }
        let rest = std::mem::take(&mut self.pending);
        self.visible.push_str(&rest);
        Ok((rest, self.visible, self.calls))
    }
}

/// The `<invoke>`s of one block, appended to `calls`.
fn parse_block(
    block: &str,
    calls: &mut Vec<ModelToolCall>,
    max_calls: usize,
) -> Result<(), String> {
    let mut rest = block;
    while let Some(at) = rest.find("<invoke") {
        let tag_end = rest[at..].find('>').ok_or("an unclosed <invoke> tag")? + at;
        let name = attribute(&rest[at..tag_end], "name")
            .filter(|n| !n.is_empty())
            .ok_or("an <invoke> without a name")?;
        let body_start = tag_end + 1;
        let body_end = rest[body_start..]
            .find("</invoke>")
            .ok_or_else(|| format!("<invoke name=\"{name}\"> is not closed"))?
            + body_start;
        let arguments = parameters(&rest[body_start..body_end], &name)?;
        if calls.len() == max_calls {
            return Err(format!("more than {max_calls} tool calls in one response"));
        }
        calls.push(ModelToolCall {
            id: format!("call_{}", uuid::Uuid::new_v4().simple()),
            name: unescape(&name),
            arguments: Value::Object(arguments).to_string(),
        });
        rest = &rest[body_end + "</invoke>".len()..];
    }
    Ok(())
}

/// The `<parameter>`s of one invoke, as an arguments object.
fn parameters(body: &str, tool: &str) -> Result<Map<String, Value>, String> {
    let mut out = Map::new();
    let mut rest = body;
    while let Some(at) = rest.find("<parameter") {
        let tag_end = rest[at..]
            .find('>')
            .ok_or_else(|| format!("{tool}: an unclosed <parameter> tag"))?
            + at;
        let name = attribute(&rest[at..tag_end], "name")
            .filter(|n| !n.is_empty())
            .ok_or_else(|| format!("{tool}: a <parameter> without a name"))?;
        let value_start = tag_end + 1;
        let value_end = rest[value_start..]
            .find("</parameter>")
            .ok_or_else(|| format!("{tool}: parameter `{name}` is not closed"))?
            + value_start;
        let name = unescape(&name);
        if out.contains_key(&name) {
            return Err(format!("{tool}: parameter `{name}` is given twice"));
        }
        out.insert(name, value(&rest[value_start..value_end]));
        rest = &rest[value_end + "</parameter>".len()..];
    }
    Ok(out)
}

/// A parameter's value: JSON when it is a JSON number, boolean, null, array or object; else
/// the text, unescaped, without the newlines around it.
fn value(raw: &str) -> Value {
    let text = unescape(raw.trim_matches(['\n', '\r']));
    let trimmed = text.trim();
    let json_like = trimmed.starts_with([
        '{', '[', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9',
    ]) || matches!(trimmed, "true" | "false" | "null");
    if json_like
        && let Ok(v) = serde_json::from_str::<Value>(trimmed)
        && !v.is_string()
    {
        return v;
    }
    Value::String(text)
}

/// `name="…"` (or single quotes) in a tag's text.
fn attribute(tag: &str, name: &str) -> Option<String> {
    let at = tag.find(&format!("{name}="))? + name.len() + 1;
    let quote = tag[at..]
        .chars()
        .next()
        .filter(|c| *c == '"' || *c == '\'')?;
    let start = at + 1;
    let end = tag[start..].find(quote)? + start;
    Some(tag[start..end].to_owned())
}

fn unescape(s: &str) -> String {
    if !s.contains('&') {
        return s.to_owned();
    }
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The system prompt's section that describes the tools and the call format.
pub fn tools_section(tools: &[Value]) -> String {
    let mut out = String::from(
        "You can use tools. To call tools, end your answer with one block in exactly this \
         format (one <invoke> per call; several calls may share the block):\n\n\
         <function_calls>\n<invoke name=\"TOOL_NAME\">\n\
         <parameter name=\"PARAMETER_NAME\">value</parameter>\n</invoke>\n</function_calls>\n\n\
         Write strings as they are, and numbers, booleans, arrays and objects as JSON. Inside \
         a value write < as &lt; and & as &amp;. The results come back in a \
         <function_results> block.\n\nThe tools:\n",
    );
    for t in tools {
        let f = &t["function"];
        out.push_str(&format!(
            "\n- {}: {}\n  parameters (JSON Schema): {}\n",
            f["name"].as_str().unwrap_or_default(),
            f["description"].as_str().unwrap_or_default(),
            f["parameters"]
        ));
    }
    out
}

/// The request's messages for an XML-mode model: the tools described in the system prompt
/// (added as one if there is none), assistant calls written as blocks, and each group of
/// tool results as one user message.
pub fn to_xml_history(messages: Vec<Value>, tools: &[Value]) -> Vec<Value> {
    let section = tools_section(tools);
    let mut out: Vec<Value> = Vec::with_capacity(messages.len() + 1);
    let mut names: std::collections::HashMap<String, String> = Default::default();
    let mut messages = messages.into_iter().peekable();
    match messages.peek() {
        Some(m) if m["role"] == "system" => {
            let mut system = messages.next().unwrap_or_default();
            let text = system["content"].as_str().unwrap_or_default().to_owned();
            system["content"] = Value::String(format!("{text}\n\n{section}"));
            out.push(system);
        }
        _ => out.push(serde_json::json!({"role": "system", "content": section})),
    }
    let mut results: Vec<String> = Vec::new();
    let flush = |results: &mut Vec<String>, out: &mut Vec<Value>| {
        if !results.is_empty() {
            let body = format!(
                "<function_results>\n{}</function_results>",
                results.concat()
            );
            out.push(serde_json::json!({"role": "user", "content": body}));
            results.clear();
        }
    };
    for m in messages {
        if m["role"] == "tool" {
            let id = m["tool_call_id"].as_str().unwrap_or_default();
            let name = names.get(id).map(String::as_str).unwrap_or_default();
            results.push(format!(
                "<result name=\"{}\" tool_call_id=\"{}\">\n{}\n</result>\n",
                escape(name),
                escape(id),
                m["content"].as_str().unwrap_or_default()
            ));
            continue;
        }
        flush(&mut results, &mut out);
        let Some(calls) = m.get("tool_calls").and_then(Value::as_array) else {
            out.push(m);
            continue;
        };
        let mut text = m["content"].as_str().unwrap_or_default().to_owned();
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(OPEN);
        text.push('\n');
        for c in calls {
            let name = c["function"]["name"].as_str().unwrap_or_default();
            names.insert(
                c["id"].as_str().unwrap_or_default().to_owned(),
                name.to_owned(),
            );
            text.push_str(&format!("<invoke name=\"{}\">\n", escape(name)));
            let args: Value = c["function"]["arguments"]
                .as_str()
                .and_then(|a| serde_json::from_str(a).ok())
                .unwrap_or_default();
            for (k, v) in args.as_object().into_iter().flatten() {
                let v = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                text.push_str(&format!(
                    "<parameter name=\"{}\">{}</parameter>\n",
                    escape(k),
                    escape(&v)
                ));
            }
            text.push_str("</invoke>\n");
        }
        text.push_str(CLOSE);
        out.push(serde_json::json!({"role": "assistant", "content": text}));
    }
    flush(&mut results, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ANSWER: &str = "Let me look — é.\n<function_calls>\n<invoke name=\"weather\">\n\
        <parameter name=\"city\">Paris &amp; Lyon</parameter>\n\
        <parameter name=\"days\">3</parameter>\n\
        <parameter name=\"opts\">{\"units\": \"C\"}</parameter>\n</invoke>\n\
        <invoke name='add'><parameter name=\"a\">-1.5</parameter></invoke>\n</function_calls>";

    fn run(pieces: &[&str]) -> (String, String, Vec<ModelToolCall>) {
        let mut x = XmlCalls::new(DEFAULT_MAX_TOOL_CALLS);
        let mut forwarded = String::new();
        for p in pieces {
            forwarded.push_str(&x.feed(p));
        }
        let (rest, visible, calls) = x.finish().unwrap();
        forwarded.push_str(&rest);
        (forwarded, visible, calls)
    }

    #[test]
    fn calls_and_text_are_the_same_however_the_stream_is_cut() {
        let (text, visible, calls) = run(&[ANSWER]);
        assert_eq!(text, "Let me look — é.\n");
        assert_eq!(visible, text);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "weather");
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(
            args,
            json!({"city": "Paris & Lyon", "days": 3, "opts": {"units": "C"}})
        );
        assert_eq!(calls[1].name, "add");
        assert_eq!(calls[1].arguments, r#"{"a":-1.5}"#);
        let bounds: Vec<usize> = ANSWER.char_indices().map(|(i, _)| i).collect();
        for &cut in &bounds {
            let (t, _, c) = run(&[&ANSWER[..cut], &ANSWER[cut..]]);
            assert_eq!(t, text, "cut at {cut}");
            assert_eq!(c.len(), 2, "cut at {cut}");
            assert_eq!(c[0].arguments, calls[0].arguments);
        }
        let singles: Vec<&str> = ANSWER
            .char_indices()
            .map(|(i, ch)| &ANSWER[i..i + ch.len_utf8()])
            .collect();
        let (t, _, c) = run(&singles);
        assert_eq!((t, c.len()), (text, 2));
    }

    /// One piece full of blocks (a hostile or batching gateway): each block is taken in
    /// place and the piece drained once. Draining after each block moved the piece's rest
    /// 100,000 times (this test: 1.25 s against 0.02 s in a debug build, growing with the
    /// square of the piece); the text between blocks still comes through.
    #[test]
    fn a_piece_full_of_blocks_is_taken_in_one_pass() {
        let blocks = 50_000;
        let piece = "x<function_calls></function_calls>".repeat(blocks);
        let (text, visible, calls) = run(&[&piece, "<function_calls", ">", "</function_calls>y"]);
        assert_eq!(text, format!("{}y", "x".repeat(blocks)));
        assert_eq!(visible, text);
        assert!(calls.is_empty());
    }

    #[test]
    fn text_that_only_looks_like_a_tag_is_forwarded() {
        let (text, _, calls) = run(&["a <func", "tion> b <", "b>"]);
        assert_eq!(text, "a <function> b <b>");
        assert!(calls.is_empty());
    }

    #[test]
    fn malformed_blocks_are_refused() {
        for bad in [
            "<function_calls><invoke name=\"x\">",
            "<function_calls><invoke name=\"x\"></invoke>",
            "<function_calls><invoke><parameter name=\"a\">1</parameter></invoke></function_calls>",
            "<function_calls><invoke name=\"x\"><parameter name=\"a\">1</parameter><parameter name=\"a\">2</parameter></invoke></function_calls>",
            "<function_calls><invoke name=\"x\"><parameter name=\"a\">1</invoke></function_calls>",
        ] {
            let mut x = XmlCalls::new(DEFAULT_MAX_TOOL_CALLS);
            x.feed(bad);
            assert!(x.finish().is_err(), "{bad}");
        }
    }

    #[test]
    fn too_many_calls_are_refused() {
        let block = format!(
            "<function_calls>{}</function_calls>",
            "<invoke name=\"f\"></invoke>".repeat(DEFAULT_MAX_TOOL_CALLS + 1)
        );
        let mut x = XmlCalls::new(DEFAULT_MAX_TOOL_CALLS);
        x.feed(&block);
        assert!(x.finish().unwrap_err().contains("more than"));
    }

    #[test]
    fn the_native_history_is_rendered_and_parses_back() {
        let tools = vec![json!({"type": "function", "function": {
            "name": "add", "description": "Adds.", "parameters": {"type": "object"}}})];
        let history = vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "1+2?"}),
            json!({"role": "assistant", "content": "Adding.", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":1,\"b\":\"<2>\"}"}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "{\"sum\":3}"}),
        ];
        let out = to_xml_history(history, &tools);
        assert_eq!(out.len(), 4);
        let system = out[0]["content"].as_str().unwrap();
        assert!(system.starts_with("Be brief.") && system.contains("- add: Adds."));
        assert!(out[2].get("tool_calls").is_none());
        let (_, _, calls) = run(&[out[2]["content"].as_str().unwrap()]);
        assert_eq!(calls[0].name, "add");
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(args, json!({"a": 1, "b": "<2>"}));
        assert_eq!(out[3]["role"], "user");
        assert!(
            out[3]["content"]
                .as_str()
                .unwrap()
                .contains("<result name=\"add\" tool_call_id=\"c1\">\n{\"sum\":3}\n</result>")
        );
    }
}
