"""Submitted jobs: the database (db), submission (submit), state refresh (track), logs (logs)."""
