"""One router module per resource (ARCHITECTURE.md: web/routes/)."""
