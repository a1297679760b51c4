"""Web: the FastAPI app, REST routes, edge protections, the Gradio UI."""
