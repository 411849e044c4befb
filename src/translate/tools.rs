//! Agents' non-function tools across protocols (gateway.md §13): how Responses namespace, custom and local_shell tools and Anthropic's fixed-schema client tools become plain function tools, how their calls find the client's own item types again, and which hosted tools a translated request leaves out.

use serde_json::{json, Value};

use crate::error::GatewayError;

/// A hosted tool the client declared that only its own provider can run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostedTool {
    /// Where the client declared it (`tools[3]`), for a refusal.
    pub param: String,
    /// Its `type` as the client wrote it (`web_search`, `web_search_20250305`).
    pub kind: String,
}

/// Responses tool types that run on OpenAI's side; no other upstream can run them.
pub fn is_responses_hosted(kind: &str) -> bool {
    const HOSTED: &[&str] = &[
        "web_search",
        "file_search",
        "code_interpreter",
        "image_generation",
        "computer_use_preview",
        "computer_use",
        "tool_search",
        "mcp",
    ];
    // Versioned spellings (`web_search_preview`, `web_search_preview_2025_03_11`) count too.
    HOSTED
        .iter()
        .any(|h| kind == *h || kind.strip_prefix(h).is_some_and(|r| r.starts_with('_')))
}

/// How a function name the upstream sees maps back to what the client declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientTool {
    /// A function inside a Responses `namespace` tool, flattened to `<namespace>__<name>`.
    Namespaced { namespace: String, name: String },
    /// A Responses `custom` tool: its free-form input travels as the string argument `input`.
    /// One declared inside a namespace keeps that namespace and its own name, as `Namespaced`.
    Custom { scope: Option<(String, String)> },
    /// The Responses `local_shell` tool: its call's `action` travels as the arguments.
    LocalShell,
}

/// The flattened names of a request's non-function tools; plain functions are not listed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolMap(Vec<(String, ClientTool)>);

impl ToolMap {
    pub fn insert(&mut self, flat: String, tool: ClientTool) {
        self.0.push((flat, tool));
    }

    pub fn get(&self, flat: &str) -> Option<&ClientTool> {
        self.0.iter().find(|(n, _)| n == flat).map(|(_, t)| t)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The name a namespaced function goes upstream under.
pub fn flatten(namespace: &str, name: &str) -> String {
    format!("{namespace}__{name}")
}

/// The one name `local_shell` calls use upstream (OpenAI's own tool name).
pub const LOCAL_SHELL: &str = "local_shell";

/// Parameters of the `local_shell` call's `exec` action, as OpenAI documents them.
pub const LOCAL_SHELL_SCHEMA: &str = r#"{"type":"object","properties":{"command":{"type":"array","items":{"type":"string"},"description":"The command and its arguments, as for execvp."},"timeout_ms":{"type":"integer","description":"Time limit in milliseconds."},"working_directory":{"type":"string","description":"Directory to run the command in."},"env":{"type":"object","additionalProperties":{"type":"string"},"description":"Environment variables to set."},"user":{"type":"string","description":"User to run the command as."}},"required":["command"]}"#;

pub const LOCAL_SHELL_DESCRIPTION: &str =
    "Runs a shell command on the user's machine and returns its output.";

/// Anthropic's `bash_*` client tool, as its documentation gives the input.
pub const BASH_SCHEMA: &str = r#"{"type":"object","properties":{"command":{"type":"string","description":"The bash command to run."},"restart":{"type":"boolean","description":"Restart the bash session."}}}"#;

pub const BASH_DESCRIPTION: &str = "Runs a command in a persistent bash session and returns its output; set restart to start a fresh session.";

/// Anthropic's `text_editor_*` client tool, as its documentation gives the input.
pub const TEXT_EDITOR_SCHEMA: &str = r#"{"type":"object","properties":{"command":{"type":"string","enum":["view","create","str_replace","insert","undo_edit"],"description":"The edit to make."},"path":{"type":"string","description":"Absolute path of the file or directory."},"file_text":{"type":"string","description":"Content of the file to create."},"old_str":{"type":"string","description":"Exact text to replace (str_replace)."},"new_str":{"type":"string","description":"Replacement text (str_replace), or text to insert (insert, older versions)."},"insert_line":{"type":"integer","description":"Line after which to insert (insert)."},"insert_text":{"type":"string","description":"Text to insert (insert)."},"view_range":{"type":"array","items":{"type":"integer"},"description":"First and last line to view (view)."},"max_characters":{"type":"integer","description":"Truncate a viewed file after this many characters."}},"required":["command","path"]}"#;

pub const TEXT_EDITOR_DESCRIPTION: &str = "Views, creates and edits text files: view, create, str_replace, insert (and undo_edit where supported).";

/// What an Anthropic tool `type` is: a client tool with a fixed schema, or a server tool.
pub enum AnthropicKind {
    Fixed {
        schema: &'static str,
        description: &'static str,
    },
    Server,
}

pub fn anthropic_kind(kind: &str) -> AnthropicKind {
    if kind.starts_with("bash_") {
        AnthropicKind::Fixed {
            schema: BASH_SCHEMA,
            description: BASH_DESCRIPTION,
        }
    } else if kind.starts_with("text_editor_") {
        AnthropicKind::Fixed {
            schema: TEXT_EDITOR_SCHEMA,
            description: TEXT_EDITOR_DESCRIPTION,
        }
    } else {
        AnthropicKind::Server
    }
}

/// The schema of a custom tool's one string parameter; a grammar or syntax the client gave is
/// told to the model in the parameter's description, the only place a function can carry it.
pub fn custom_schema(format: Option<&Value>) -> String {
    let mut description = "The tool's free-form input.".to_owned();
    if let Some(f) = format.filter(|f| f.get("type").and_then(Value::as_str) == Some("grammar")) {
        let syntax = f.get("syntax").and_then(Value::as_str).unwrap_or("lark");
        let definition = f.get("definition").and_then(Value::as_str).unwrap_or("");
        description = format!(
            "The tool's free-form input (not JSON), matching this {syntax} grammar:\n{definition}"
        );
    }
    json!({"type": "object", "properties": {"input": {"type": "string", "description": description}},
        "required": ["input"], "additionalProperties": false})
    .to_string()
}

/// The `input` of a custom tool's call from the function arguments the model wrote; text that
/// is not the expected object is passed on whole, since it is the best reading of the model's intent.
pub fn custom_input(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(mut o)) => match o.remove("input") {
            Some(Value::String(s)) => s,
            Some(other) => other.to_string(),
            None => arguments.to_owned(),
        },
        _ => arguments.to_owned(),
    }
}

/// A `local_shell_call`'s `action` from the function arguments the model wrote.
pub fn local_shell_action(arguments: &str) -> Value {
    let mut action = match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(o)) => o,
        _ => serde_json::Map::new(),
    };
    action.insert("type".into(), json!("exec"));
    action.entry("command").or_insert_with(|| json!([]));
    Value::Object(action)
}

/// The function arguments for a `local_shell_call`'s `action` from the client's history.
pub fn local_shell_arguments(action: Option<&str>) -> String {
    match action.and_then(|a| serde_json::from_str::<Value>(a).ok()) {
        Some(Value::Object(mut o)) => {
            o.remove("type");
            Value::Object(o).to_string()
        }
        _ => "{}".to_owned(),
    }
}

/// Tool names must stay unique once flattened: a 400 naming both declarations.
pub fn check_unique(names: &[(String, String)]) -> Result<(), GatewayError> {
    for (i, (name, at)) in names.iter().enumerate() {
        if let Some((_, first)) = names[..i].iter().find(|(n, _)| n == name) {
            return Err(GatewayError::invalid(
                at.clone(),
                format!(
                    "the tool name {name:?} is declared twice: by `{first}` and by `{at}` (a namespace's tools are named `<namespace>__<name>` upstream); tool names must be unique"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosted_kinds_and_their_versions() {
        assert!(is_responses_hosted("web_search"));
        assert!(is_responses_hosted("web_search_preview_2025_03_11"));
        assert!(is_responses_hosted("tool_search"));
        assert!(!is_responses_hosted("function"));
        assert!(!is_responses_hosted("web_searcher"));
    }

    #[test]
    fn custom_and_shell_arguments_round_trip() {
        assert_eq!(
            custom_input(r#"{"input":"*** Begin Patch\n"}"#),
            "*** Begin Patch\n"
        );
        assert_eq!(custom_input("not json"), "not json");
        let action = local_shell_action(r#"{"command":["ls","-l"],"timeout_ms":5}"#);
        assert_eq!(action["type"], "exec");
        assert_eq!(action["command"][1], "-l");
        let args = local_shell_arguments(Some(r#"{"type":"exec","command":["ls"]}"#));
        assert_eq!(args, r#"{"command":["ls"]}"#);
        let schema: Value = serde_json::from_str(&custom_schema(Some(
            &json!({"type": "grammar", "syntax": "lark", "definition": "start: x"}),
        )))
        .unwrap_or_default();
        assert!(schema["properties"]["input"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("start: x")));
    }

    #[test]
    fn a_flattened_collision_names_both() {
        let names = vec![
            ("a__b".to_owned(), "tools[0].tools[0]".to_owned()),
            ("c".to_owned(), "tools[1]".to_owned()),
            ("a__b".to_owned(), "tools[2]".to_owned()),
        ];
        let e = check_unique(&names)
            .err()
            .map(|e| e.message)
            .unwrap_or_default();
        assert!(
            e.contains("tools[0].tools[0]") && e.contains("tools[2]"),
            "{e}"
        );
    }
}
