"""Policy: what the engine allows, and when, apart from how it runs an agent: the
quality gates on what agents say (gates), a step's attempts and streaks
(attempts), usage limits and quota pacing (limits, quota), the humans'
lifecycle hooks (hooks, lifecycle). Nothing is imported here."""
