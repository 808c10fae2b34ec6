"""The API-wide fuzzer's parts (tools/api_fuzz.py is the command): value classes, the case model and judge, the
forked runner, shared invariant checkers and the per-API registrations."""
