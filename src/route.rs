//! Model routing: a client's model name on an address → the configured model entry (exact name first, then the longest `prefix*`).

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::Model;
pub use crate::domain::NamePattern;
use crate::domain::{Address, Protocol};
use crate::error::{ErrorKind, GatewayError};

/// The model table, built once from the config.
#[derive(Debug, Default)]
pub struct ModelTable {
    /// One name may have entries on disjoint addresses (token_plan routed to its own upstream).
    exact: HashMap<String, Vec<Arc<Model>>>,
    /// Prefix patterns, longest prefix first, so the first match is the most specific.
    prefixes: Vec<(String, Arc<Model>)>,
    all: Vec<Arc<Model>>,
}

impl ModelTable {
    pub fn new(models: &[Arc<Model>]) -> Self {
        let mut table = Self::default();
        for m in models {
            match &m.pattern {
                NamePattern::Exact(n) => table.exact.entry(n.clone()).or_default().push(m.clone()),
                NamePattern::Prefix(p) => table.prefixes.push((p.clone(), m.clone())),
                NamePattern::Any => table.prefixes.push((String::new(), m.clone())),
            }
            table.all.push(m.clone());
        }
        table
            .prefixes
            .sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        table
    }

    /// The entry serving `name` on `address`, ignoring entries for other addresses.
    ///
    /// An exact entry on another address does not hide a pattern that serves this one, so a
    /// token-plan address can route `glm-4.6` to its own upstream while base routes it elsewhere.
    pub fn resolve(&self, name: &str, address: Address) -> Result<&Arc<Model>, GatewayError> {
        if let Some(m) = self
            .exact
            .get(name)
            .and_then(|ms| ms.iter().find(|m| m.addresses.contains(address)))
        {
            return Ok(m);
        }
        self.prefixes
            .iter()
            .find(|(p, m)| name.starts_with(p.as_str()) && m.addresses.contains(address))
            .map(|(_, m)| m)
            .ok_or_else(|| unknown_model(name, address))
    }

    pub fn all(&self) -> &[Arc<Model>] {
        &self.all
    }
}

/// A 400 when `model` is not served on `protocol`'s path, naming the path that serves it.
pub fn check_endpoint(
    model: &Model,
    client_name: &str,
    protocol: Protocol,
) -> Result<(), GatewayError> {
    if model.endpoints.contains(protocol) {
        return Ok(());
    }
    let paths: Vec<&str> = model.endpoints.iter().map(Protocol::client_path).collect();
    Err(GatewayError::invalid(
        "model",
        format!(
            "the model {client_name:?} is not served on {}; use {}",
            protocol.client_path(),
            paths.join(" or ")
        ),
    ))
}

/// The answer for a model that does not exist, is not served on `address`, or that the key may
/// not use: one status and one message for all three, so a key cannot list what exists
/// (gateway.md §14).
pub fn unknown_model(name: &str, address: Address) -> GatewayError {
    GatewayError::new(
        ErrorKind::ModelNotFound,
        format!(
            "the model {name:?} does not exist or is not served on this address ({})",
            address.name()
        ),
    )
    .with_param("model")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        assert_eq!(NamePattern::parse("*").unwrap(), NamePattern::Any);
        assert_eq!(
            NamePattern::parse("gpt-*").unwrap(),
            NamePattern::Prefix("gpt-".into())
        );
        assert!(NamePattern::parse("g*t").is_err());
        assert!(NamePattern::parse("").is_err());
        let p = NamePattern::parse("gpt-*").unwrap();
        assert!(p.matches("gpt-4"));
        assert!(!p.matches("gp"));
        assert!(p.covers(&NamePattern::Prefix("gpt-4".into())));
        assert!(!p.covers(&NamePattern::Prefix("gp".into())));
        assert!(!p.covers(&NamePattern::Any));
    }
}
