"""One module per scheduler (PSI/J style). Output parsers are pure functions, tested on recorded
outputs; the submit/query/cancel verbs build on them."""
