"""The aggregation service over HTTP: the FastAPI app, its tokens, the server process and the
student's HTTP client."""
