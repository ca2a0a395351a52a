"""Research programmes over draftlab's public API; not installed with the product."""
