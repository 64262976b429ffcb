"""Reports: plain-text tables and JSON objects of results."""
