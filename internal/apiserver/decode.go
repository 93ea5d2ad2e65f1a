package apiserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/quantity"
)

// maxBody bounds a request body; the largest legitimate one is a bulk clone
// of MaxBulkClones names.
const maxBody = 1 << 20

// decode reads exactly one JSON object into v, refusing unknown fields,
// trailing data, wrong types and oversize bodies with a message naming the
// field.
func decode(r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return &badRequest{msg: fmt.Sprintf("Content-Type %q: must be application/json", ct)}
	}
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return &badRequest{msg: "request body: must hold a single JSON object"}
	}
	return nil
}

func decodeError(err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	var maxErr *http.MaxBytesError
	switch {
	case errors.Is(err, io.EOF):
		return &badRequest{msg: "request body: a JSON object is required"}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &badRequest{msg: "request body: malformed JSON: it ends inside a value"}
	case errors.As(err, &typeErr):
		name := typeErr.Field
		if name == "" {
			name = "request body"
		}
		return &badRequest{field: typeErr.Field, msg: fmt.Sprintf("%s: must be %s (got JSON %s)", name, typeName(typeErr.Type.Kind()), typeErr.Value)}
	case errors.As(err, &syntaxErr):
		return &badRequest{msg: fmt.Sprintf("request body: malformed JSON at byte %d: %v", syntaxErr.Offset, err)}
	case errors.As(err, &maxErr):
		return &badRequest{msg: "request body: larger than " + quantity.Format(maxBody)}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return &badRequest{field: field, msg: fmt.Sprintf("%s: unknown field", field)}
	default:
		return &badRequest{msg: "request body: " + err.Error()}
	}
}

func typeName(kind reflect.Kind) string {
	switch kind {
	case reflect.Int64, reflect.Int, reflect.Int32, reflect.Uint64:
		return "an integer number of bytes that fits in 64 bits"
	case reflect.Map, reflect.Struct:
		return "a JSON object"
	case reflect.Slice:
		return "a JSON array"
	case reflect.Bool:
		return "a boolean"
	default:
		return "a " + kind.String()
	}
}

// idempotency reads how a create treats a taken name: the Idempotency-Key
// header and ?idempotent=true.
func idempotency(r *http.Request) (pool.Idempotency, error) {
	idem := pool.Idempotency{Key: r.Header.Get(api.IdempotencyKeyHeader)}
	if err := pool.ValidateIdempotencyKey(api.IdempotencyKeyHeader, idem.Key); err != nil {
		return idem, err
	}
	var err error
	idem.SameSpec, err = boolQuery(r, api.QueryIdempotent)
	return idem, err
}

// boolQuery reads a query parameter that is absent, "true" or "false".
func boolQuery(r *http.Request, name string) (bool, error) {
	switch v := r.URL.Query().Get(name); v {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	default:
		return false, &badRequest{field: name, msg: fmt.Sprintf("query parameter %s=%q: want true or false", name, v)}
	}
}
