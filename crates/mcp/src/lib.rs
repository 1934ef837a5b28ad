//! MCP face (in progress).
