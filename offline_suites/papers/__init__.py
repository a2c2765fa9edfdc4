"""The seventeen paper suites, one module each; the platform that runs them lives in ``offline_suites``."""
