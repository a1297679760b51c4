"""Domain: no torch, no web: types, errors, the rich-text vocabulary, exports."""
