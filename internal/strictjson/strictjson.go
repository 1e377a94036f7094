// Package strictjson decodes JSON Corral reads from outside (request
// bodies, tool arguments, a worker's reports) one way only: encoding/json
// would take a name given twice, a name in the wrong case or text that is
// not UTF-8 silently, and two readers could then disagree on what was
// sent. Errors are errdefs.ErrInvalidArgument naming the field.
package strictjson

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"unicode/utf8"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Decode strictly decodes a JSON object into v. It uses
// encoding/json/v2's rules (github.com/go-json-experiment/json, its
// upstream, which is an alias of the standard library's from Go 1.27 on):
// names match fields exactly, case included, and a name v has no field
// for, a name given twice in one object, text that is not UTF-8 (raw
// bytes, or an escaped lone surrogate) and anything after the object are
// refused with ErrInvalidArgument naming the field.
// encoding/json would take each of these silently: the last of two names
// wins, a name matches any field that differs only in case (so two names
// can also collide that way), and bad UTF-8 becomes U+FFFD.
func Decode(args json.RawMessage, v any) error {
	err := jsonv2.Unmarshal(args, v, jsonv2.RejectUnknownMembers(true))
	if err == nil {
		return nil
	}
	var se *jsontext.SyntacticError
	var me *jsonv2.SemanticError
	switch {
	case errors.As(err, &se):
		return syntaxError(args, se)
	case errors.As(err, &me):
		return semanticError(me)
	}
	return fmt.Errorf("decode the JSON: %v: %w", err, errdefs.ErrInvalidArgument)
}

// syntaxError says what is wrong with JSON that does not parse, and where.
func syntaxError(args []byte, se *jsontext.SyntacticError) error {
	field := fieldName(se.JSONPointer)
	var msg string
	switch {
	case errors.Is(se.Err, jsontext.ErrDuplicateName):
		msg = "is given more than once; give each name once"
	case invalidUTF8Before(args, se.ByteOffset):
		msg = fmt.Sprintf("is not valid UTF-8 (at byte %d); JSON text must be UTF-8", se.ByteOffset)
		if field == "" {
			msg = "the JSON " + msg
		}
	default:
		msg = fmt.Sprintf("invalid JSON at byte %d: %v", se.ByteOffset, se.Err)
	}
	if field == "" {
		return fmt.Errorf("%s: %w", msg, errdefs.ErrInvalidArgument)
	}
	return errdefs.Field(field, msg)
}

// invalidUTF8Before reports whether args has a byte that is not UTF-8 at
// or before off, where the parser stopped: what it stopped on.
func invalidUTF8Before(args []byte, off int64) bool {
	for i := 0; i < len(args) && int64(i) <= off; {
		r, n := utf8.DecodeRune(args[i:])
		if r == utf8.RuneError && n == 1 {
			return true
		}
		i += n
	}
	return false
}

// semanticError says which field has a value of the wrong kind, or is
// unknown.
func semanticError(me *jsonv2.SemanticError) error {
	field := fieldName(me.JSONPointer)
	if errors.Is(me.Err, jsonv2.ErrUnknownName) {
		if field == "" { // the name ""
			return fmt.Errorf(`the name "" is not a known field: %w`, errdefs.ErrInvalidArgument)
		}
		return errdefs.Field(field, "is not a known field")
	}
	got := me.JSONKind.String()
	switch me.JSONKind {
	case '"':
		got = "a string"
	case '0':
		got = "a number"
		if len(me.JSONValue) > 0 {
			got = string(me.JSONValue)
		}
	case '{':
		got = "an object"
	case '[':
		got = "an array"
	}
	want := "another kind of value"
	if me.GoType != nil {
		want = kindOf(me.GoType)
	}
	if field == "" {
		return fmt.Errorf("the JSON must be %s, not %s: %w", want, got, errdefs.ErrInvalidArgument)
	}
	return errdefs.Field(field, fmt.Sprintf("must be %s, not %s", want, got))
}

// kindOf names the JSON a Go type takes.
func kindOf(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number in range"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "another kind of value"
}

// fieldName writes a JSON pointer the way Corral's errors name fields:
// "resources.memory_limit", "context_files[0]". An all-digit name is
// written as an index, whether it is one or a map key.
func fieldName(p jsontext.Pointer) string {
	var b strings.Builder
	for tok := range p.Tokens() {
		switch {
		case b.Len() > 0 && tok != "" && strings.Trim(tok, "0123456789") == "":
			b.WriteString("[" + tok + "]")
		case b.Len() > 0:
			b.WriteString("." + tok)
		default:
			b.WriteString(tok)
		}
	}
	return b.String()
}
