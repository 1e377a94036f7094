package service

import (
	"errors"
	"fmt"

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
