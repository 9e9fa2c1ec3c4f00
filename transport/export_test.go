package transport

// Redact exposes redact to the tests.
var Redact = redact
