package service

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/task"
)

// MaxAllowEntries bounds a task's or a session's own allowlist.
const MaxAllowEntries = 256

// CheckNetwork checks a network policy against the ones a server offers
// (networks: why each cannot be used, "" if it can; none is always
// offered) and an own allowlist against checkAllow (nil: none is taken),
// naming the request's fields; every problem at once.
func CheckNetwork(networks map[string]string, checkAllow func([]string) error, network string, allow []string, networkField, allowField string) error {
	var errs []error
	if why, ok := networks[network]; !ok && network != task.NetworkNone {
		errs = append(errs, errdefs.Field(networkField, fmt.Sprintf("%q is not a network policy (one of: none, allowlist, open)", clip.String(network, 64))))
	} else if why != "" {
		errs = append(errs, &errdefs.FieldError{Field: networkField, Err: fmt.Errorf("%q is not available: %s: %w", network, why, errdefs.ErrFailedPrecondition)})
	}
	switch {
	case allow == nil:
	case network == task.NetworkNone:
		errs = append(errs, errdefs.Field(allowField, "applies to network allowlist or open, not none"))
	case len(allow) > MaxAllowEntries:
		errs = append(errs, errdefs.Field(allowField, fmt.Sprintf("has %d entries, over %d", len(allow), MaxAllowEntries)))
	case checkAllow == nil:
		errs = append(errs, errdefs.Field(allowField, "is not taken here: this server has no egress proxy"))
	default:
		if err := checkAllow(allow); err != nil {
			errs = append(errs, &errdefs.FieldError{Field: allowField, Err: err})
		}
	}
	return errors.Join(errs...)
}

// MaxCredentials bounds the credential rules one task or session names.
const MaxCredentials = 32

// CheckCredentials checks the credential rules a task or session asks for
// by name: each one of known (the rules given on request), and only with
// a network.
func CheckCredentials(known []string, network string, names []string, field string) error {
	switch {
	case len(names) == 0:
		return nil
	case network == task.NetworkNone:
		return errdefs.Field(field, "apply to network allowlist or open, not none")
	case len(names) > MaxCredentials:
		return errdefs.Field(field, fmt.Sprintf("has %d entries, over %d", len(names), MaxCredentials))
	}
	var errs []error
	for i, n := range names {
		if !slices.Contains(known, n) {
			offered := "none is"
			if len(known) > 0 {
				offered = strings.Join(known, ", ") + " are"
			}
			errs = append(errs, errdefs.Field(fmt.Sprintf("%s[%d]", field, i), fmt.Sprintf("%q is not a credential rule given on request (%s)", clip.String(n, 64), offered)))
		}
	}
	return errors.Join(errs...)
}
