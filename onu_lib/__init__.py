"""The libraries behind the scripts at the root (the core ones, onu_input and onu_model, stay there)."""
