"""HTTP routes; each module holds one router."""
