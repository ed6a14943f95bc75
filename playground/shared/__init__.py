"""What every tab shares: the context (engine pool, settings, sessions), parsing, conversations, jobs."""
