package powercut

import "regexp"

// tokenPattern matches attachment tokens (64 hex digits), which the test
// keeps out of its messages as the server keeps them out of its logs.
var tokenPattern = regexp.MustCompile(`[0-9a-f]{64}`)

func redact(s string) string { return tokenPattern.ReplaceAllString(s, "<token>") }
