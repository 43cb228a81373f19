"""The viewer's pages: one module per page, each exposing ``routes`` (viewer.app gathers them)."""
