package egress

import "net/netip"

// specialPrefixes are ranges a worker must not reach unless an allow entry
// names the address: the host itself, the local networks, and ranges that
// are not the public internet (RFC 6890 and its updates). The checks of
// netip.Addr (loopback, private, link-local, multicast, unspecified) come
// first; these fill the gaps.
var specialPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),          // "this network"
	netip.MustParsePrefix("100.64.0.0/10"),      // CGNAT shared address space
	netip.MustParsePrefix("192.0.0.0/24"),       // IETF protocol assignments
	netip.MustParsePrefix("192.0.2.0/24"),       // TEST-NET-1
	netip.MustParsePrefix("198.18.0.0/15"),      // benchmarking
	netip.MustParsePrefix("198.51.100.0/24"),    // TEST-NET-2
	netip.MustParsePrefix("203.0.113.0/24"),     // TEST-NET-3
	netip.MustParsePrefix("240.0.0.0/4"),        // reserved, and broadcast
	netip.MustParsePrefix("100::/64"),           // discard-only
	netip.MustParsePrefix("2001::/23"),          // IETF protocol assignments (Teredo, ...)
	netip.MustParsePrefix("2001:db8::/32"),      // documentation
	netip.MustParsePrefix("fec0::/10"),          // deprecated site-local
	netip.MustParsePrefix("::/96"),              // IPv4-compatible (deprecated)
	netip.MustParsePrefix("64:ff9b:1::/48"),     // local-use NAT64
	netip.MustParsePrefix("ff00::/8"),           // multicast (also netip's IsMulticast)
	netip.MustParsePrefix("fc00::/7"),           // unique local (also netip's IsPrivate)
	netip.MustParsePrefix("169.254.0.0/16"),     // link-local (also netip's IsLinkLocalUnicast)
	netip.MustParsePrefix("255.255.255.255/32"), // broadcast
}

// embedsIPv4 are IPv6 ranges that carry an IPv4 address the network turns
// into an IPv4 connection: that address decides.
var embedsIPv4 = []struct {
	prefix netip.Prefix
	at     int // byte offset of the IPv4 address
}{
	{netip.MustParsePrefix("64:ff9b::/96"), 12},
	{netip.MustParsePrefix("2002::/16"), 2},
}

// Special reports whether a is not a public internet address: loopback,
// private (RFC 1918, unique local), link-local, multicast, unspecified,
// CGNAT, documentation, benchmarking, reserved, or an IPv6 address that
// embeds such an IPv4 address (IPv4-mapped, NAT64, 6to4).
func Special(a netip.Addr) bool {
	if !a.IsValid() {
		return true
	}
	a = a.Unmap()
	for _, e := range embedsIPv4 {
		if e.prefix.Contains(a) {
			b := a.As16()
			if Special(netip.AddrFrom4([4]byte(b[e.at : e.at+4]))) {
				return true
			}
			return false
		}
	}
	if a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || a.IsUnspecified() {
		return true
	}
	for _, p := range specialPrefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
