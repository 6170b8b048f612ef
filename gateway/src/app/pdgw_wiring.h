/*
 * pdgw_wiring.h - every room's hooks registered with the serving core (pdgw_wiring.c). Call
 * before pdgw_server_create; later calls return the first one's result.
 */
#ifndef PDGW_WIRING_H
#define PDGW_WIRING_H

#include "pdgw_errors.h"

pdgw_status_t pdgw_gateway_wire(void);

#endif /* PDGW_WIRING_H */
