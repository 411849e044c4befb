//! The thinking switch's one rule for Anthropic-style budgets, shared by passthrough and translation.

/// Anthropic refuses a thinking budget under this.
pub const MIN_BUDGET: u64 = 1024;

/// What an Anthropic-style `thinking` object and its reply limit should say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub budget_tokens: u64,
    /// A reply limit to write in place of the client's, when the client's would be refused.
    pub raised_max_tokens: Option<u64>,
}

/// Effort names → a budget (LiteLLM's defaults, raised to Anthropic's floor).
pub fn effort_to_budget(effort: &str) -> u64 {
    match effort {
        "high" => 4096,
        "xhigh" => 8192,
        "max" => 16384,
        "medium" => 2048,
        _ => MIN_BUDGET,
    }
}

/// A budget → the effort name that asks for about as much.
pub fn budget_to_effort(budget: u64) -> &'static str {
    match budget {
        b if b >= 4096 => "high",
        b if b >= 2048 => "medium",
        _ => "low",
    }
}

/// The budget for an enabled switch: the client's own budget, else its effort's, else half the
/// reply limit (explicit, else the model's default); never under
/// Anthropic's floor. Anthropic wants `budget_tokens < max_tokens`: a reply limit at or under
/// the budget is raised rather than the thinking shrunk, since the client asked for both.
pub fn anthropic_budget(
    client_budget: Option<u64>,
    effort: Option<&str>,
    max_tokens: Option<u64>,
    default_max_tokens: Option<u64>,
) -> Budget {
    let budget = client_budget
        .filter(|b| *b > 0)
        .or_else(|| effort.map(effort_to_budget))
        .or_else(|| max_tokens.or(default_max_tokens).map(|m| m / 2))
        .unwrap_or(MIN_BUDGET)
        .max(MIN_BUDGET);
    let raised_max_tokens = max_tokens
        .filter(|m| *m <= budget)
        .map(|_| budget + budget.min(4096));
    Budget {
        budget_tokens: budget,
        raised_max_tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_fits_under_the_reply_limit() {
        // A client's max_tokens of 500 cannot hold the 1024 floor: the limit grows.
        let b = anthropic_budget(None, None, Some(500), None);
        assert_eq!(b.budget_tokens, 1024);
        assert_eq!(b.raised_max_tokens, Some(2048));
        // Half the limit when that is above the floor; the limit then fits as it is.
        let b = anthropic_budget(None, None, Some(8000), None);
        assert_eq!((b.budget_tokens, b.raised_max_tokens), (4000, None));
        // The client's budget wins, and the limit is raised past it.
        let b = anthropic_budget(Some(5000), Some("low"), Some(5000), None);
        assert_eq!((b.budget_tokens, b.raised_max_tokens), (5000, Some(9096)));
        // Effort when no budget; the default limit only sizes the budget, it is never raised.
        let b = anthropic_budget(None, Some("high"), None, Some(2000));
        assert_eq!((b.budget_tokens, b.raised_max_tokens), (4096, None));
        let b = anthropic_budget(None, None, None, None);
        assert_eq!((b.budget_tokens, b.raised_max_tokens), (MIN_BUDGET, None));
    }
}
