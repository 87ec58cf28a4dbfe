// feedline — umbrella header.
#ifndef FEEDLINE_FEEDLINE_H_
#define FEEDLINE_FEEDLINE_H_

#include "feedline/batch.h"
#include "feedline/dataset.h"
#include "feedline/loader.h"
#include "feedline/options.h"
#include "feedline/stats.h"

#endif  // FEEDLINE_FEEDLINE_H_
