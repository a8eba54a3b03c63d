"""The model gateway, the only way to a model from inside the sandbox: the server and its
Anthropic Messages side (``messages``), and its OpenAI Responses side (``responses``), with
an answer's usage read as it streams by (``usage``). It holds the key and charges the
issue's budget; nothing in it knows about loops."""
