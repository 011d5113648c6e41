"""The OpenAI-compatible streaming server: `create_app(host)` over one real-time engine thread."""
