package errdefs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"syscall"
	"testing"
)

// Every class's status turns back into a class with the same status, so
// an error crossing HTTP keeps its status (and, where one class has the
// status alone, its class).
func TestClassesRoundTrip(t *testing.T) {
	for _, c := range Classes {
		wrapped := fmt.Errorf("something: %w", c.Err)
		status := HTTPStatus(wrapped)
		if status != c.HTTPStatus {
			t.Errorf("%v: status %d, want %d (a class before it in the table took it)", c.Err, status, c.HTTPStatus)
		}
		back := FromHTTPStatus(status)
		if back == nil || HTTPStatus(back) != status {
			t.Errorf("%v: %d came back as %v", c.Err, status, back)
		}
	}
	for _, c := range []struct {
		err  error
		want int
	}{
		{errors.New("boom"), http.StatusInternalServerError},
		{Field("x", "bad"), http.StatusBadRequest},
		{&FieldError{Field: "f", Err: ErrNotFound}, http.StatusNotFound},
		{fmt.Errorf("upload: %w", ErrTooLarge), http.StatusRequestEntityTooLarge},
		{fmt.Errorf("write: %w", ErrNoSpace), http.StatusInsufficientStorage},
		{ErrResourceExhausted, http.StatusTooManyRequests},
		{context.Canceled, http.StatusServiceUnavailable},
	} {
		if got := HTTPStatus(c.err); got != c.want {
			t.Errorf("HTTPStatus(%v) = %d, want %d", c.err, got, c.want)
		}
	}
	for code, want := range map[int]error{
		507: ErrNoSpace, 413: ErrTooLarge, 415: ErrInvalidArgument, 502: ErrUnavailable, 504: ErrUnavailable, 409: ErrConflict,
	} {
		if got := FromHTTPStatus(code); got != want {
			t.Errorf("FromHTTPStatus(%d) = %v, want %v", code, got, want)
		}
	}
	if FromHTTPStatus(500) != nil || Classified(errors.New("boom")) || !Classified(ErrNoSpace) {
		t.Error("an unclassified error must stay a 500 and unclassified")
	}
}

// An error answer is of every class its status carries.
func TestHTTPStatusIs(t *testing.T) {
	for _, c := range []struct {
		code int
		err  error
		want bool
	}{
		{409, ErrConflict, true}, {409, ErrAlreadyExists, true}, {409, ErrNotFound, false},
		{413, ErrTooLarge, true}, {413, ErrResourceExhausted, true}, {507, ErrNoSpace, true},
		{429, ErrNoSpace, false}, {415, ErrInvalidArgument, true}, {502, ErrUnavailable, true},
		{500, ErrUnavailable, false},
	} {
		if got := HTTPStatusIs(c.code, c.err); got != c.want {
			t.Errorf("HTTPStatusIs(%d, %v) = %v, want %v", c.code, c.err, got, c.want)
		}
	}
}

// A write the file system refused for want of space is the class of a
// full disk wherever it is answered (MCP, HTTP), not an internal error.
func TestNoSpaceFromTheFileSystem(t *testing.T) {
	err := fmt.Errorf("write output: %w", &os.PathError{Op: "write", Path: "/data/tasks/t/output/x", Err: syscall.ENOSPC})
	if got := HTTPStatus(err); got != http.StatusInsufficientStorage || !Classified(err) {
		t.Errorf("HTTPStatus = %d, classified %v; want 507 and classified", got, Classified(err))
	}
}
