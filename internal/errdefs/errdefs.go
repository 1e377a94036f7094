// Package errdefs defines the small, fixed set of error classes every Corral
// package uses to classify failures. Callers check them with errors.Is; the
// HTTP and MCP transports map them to status codes through one table,
// Classes.
package errdefs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"syscall"
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

// ErrNoSpace is the ErrResourceExhausted of a full disk: the data root
// below its free-space floor, or a write the filesystem refused (ENOSPC,
// SQLite's "database or disk is full"). Transports answer it with 507.
var ErrNoSpace = fmt.Errorf("no space left on the server's disk: %w", ErrResourceExhausted)

// A Class is an error class and the HTTP status that carries it.
type Class struct {
	Err        error
	HTTPStatus int
}

// Classes is the one table between error classes and HTTP statuses, used
// both ways: the server answers an error with the status of the first
// class it belongs to (HTTPStatus), and the client turns a status back
// into the first class with that status (FromHTTPStatus). The more
// specific classes come first.
var Classes = []Class{
	{ErrTooLarge, http.StatusRequestEntityTooLarge},
	{ErrNoSpace, http.StatusInsufficientStorage},
	// A write the file system refused for want of space, wherever it was.
	{syscall.ENOSPC, http.StatusInsufficientStorage},
	{ErrUnauthenticated, http.StatusUnauthorized},
	{ErrPermissionDenied, http.StatusForbidden},
	{ErrNotFound, http.StatusNotFound},
	{ErrFailedPrecondition, http.StatusUnprocessableEntity},
	{ErrInvalidArgument, http.StatusBadRequest},
	{ErrConflict, http.StatusConflict},
	{ErrAlreadyExists, http.StatusConflict},
	{ErrResourceExhausted, http.StatusTooManyRequests},
	{ErrNotImplemented, http.StatusNotImplemented},
	{ErrUnavailable, http.StatusServiceUnavailable},
	// A request cancelled or out of time while the server was busy.
	{context.Canceled, http.StatusServiceUnavailable},
	{context.DeadlineExceeded, http.StatusServiceUnavailable},
}

// HTTPStatus is the status of err's class, or 500 for an error of none:
// an unclassified error is the server's own, and its text is not the
// caller's to read.
func HTTPStatus(err error) int {
	for _, c := range Classes {
		if errors.Is(err, c.Err) {
			return c.HTTPStatus
		}
	}
	return http.StatusInternalServerError
}

// Classified reports whether err belongs to a class, so that its message
// is meant for the caller.
func Classified(err error) bool { return HTTPStatus(err) != http.StatusInternalServerError }

// HTTPStatusIs reports whether an error answer with status code may be of
// class target: whether target is, or wraps, a class with that status. A
// 409 is both ErrConflict and ErrAlreadyExists, as the server could have
// meant either.
func HTTPStatusIs(code int, target error) bool {
	if c := FromHTTPStatus(code); c != nil && errors.Is(c, target) {
		return true
	}
	for _, c := range Classes {
		if c.HTTPStatus == code && errors.Is(c.Err, target) {
			return true
		}
	}
	return false
}

// FromHTTPStatus is the class of an error answer with status code, or nil
// for a status no class has (a 500). 415 is a request the server cannot
// read (invalid); 502 and 504 come from a proxy in front of a server that
// is not answering (restarting): unavailable, as the server's own 503.
func FromHTTPStatus(code int) error {
	switch code {
	case http.StatusUnsupportedMediaType:
		return ErrInvalidArgument
	case http.StatusBadGateway, http.StatusGatewayTimeout:
		return ErrUnavailable
	}
	for _, c := range Classes {
		if c.HTTPStatus == code {
			return c.Err
		}
	}
	return nil
}

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
