"""Claude-Code-shaped Messages requests for benches; bench/claude_code_request.py is the entry point."""
