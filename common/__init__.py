"""The Django-free core every app may import: the error root, parameter validators, the retry policy."""
