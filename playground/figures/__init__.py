"""Charts and figures, drawn as pure functions of what the engine reports (and of the session's own record)."""
