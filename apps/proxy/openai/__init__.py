"""OpenAI's wire protocols on the shared model call: Chat Completions (chat.py) and, through
the same framework, Responses; their error shapes (errors.py)."""
