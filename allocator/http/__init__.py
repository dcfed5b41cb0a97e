"""The node's admin HTTP server: bounded server, endpoints, the status page."""
