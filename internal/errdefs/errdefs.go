// Package errdefs defines the small, fixed set of error classes every Corral
// package uses to classify failures. Callers check them with errors.Is; the
// HTTP and MCP transports map them to status codes in exactly one place.
package errdefs

import (
	"errors"
	"fmt"
)

// The error classes. Wrap one with fmt.Errorf("...: %w", ErrX) to classify an
// error; never compare error strings.
var (
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrConflict           = errors.New("conflict")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrUnavailable        = errors.New("unavailable")
	ErrNotImplemented     = errors.New("not implemented")
	ErrUnauthenticated    = errors.New("unauthenticated")
)

// ErrTooLarge is the ErrResourceExhausted of a request or file over a size
// limit; transports answer it with 413 instead of 429.
var ErrTooLarge = fmt.Errorf("too large: %w", ErrResourceExhausted)

// FieldError is one validation problem with a named input field. Validation
// returns every problem at once with errors.Join of FieldErrors.
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Err.Error() }

// Unwrap returns the underlying error so errors.Is sees its class.
func (e *FieldError) Unwrap() error { return e.Err }

// Is reports every FieldError as ErrInvalidArgument, whatever it wraps.
func (e *FieldError) Is(target error) bool { return target == ErrInvalidArgument }

// Field returns a FieldError for field with a message.
func Field(field, msg string) error { return &FieldError{Field: field, Err: errors.New(msg)} }

// Retryable reports whether err is of a class a caller may retry: only
// ErrUnavailable and ErrResourceExhausted.
func Retryable(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrResourceExhausted)
}
