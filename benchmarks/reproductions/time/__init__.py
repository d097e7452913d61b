"""Time to accuracy (issue 22 item 5): every built-in scheme charged in simulated seconds, beside rounds."""
