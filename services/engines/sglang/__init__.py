"""The SGLang engine: HTTP client, sticky router, weight broadcast and server launcher."""
