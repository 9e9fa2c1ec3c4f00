package transport

// Redact exposes redact to the tests.
var Redact = redact

// VersionAtLeast exposes versionAtLeast to the tests.
var VersionAtLeast = versionAtLeast

// SetAfterCreate sets the hook ensureStream runs between creating a
// stream and its consumer.
func SetAfterCreate(f func(stream string)) { afterCreate = f }
