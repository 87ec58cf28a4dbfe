// feedline — umbrella header: the engine's API (schema, data sets, transforms, loader, batches)
// and the image built-in. The LibTorch adapter is separate: feedline/torch.h.
#ifndef FEEDLINE_FEEDLINE_H_
#define FEEDLINE_FEEDLINE_H_

#include "feedline/batch.h"
#include "feedline/dataset.h"
#include "feedline/error.h"
#include "feedline/files.h"
#include "feedline/image.h"
#include "feedline/loader.h"
#include "feedline/mix.h"
#include "feedline/options.h"
#include "feedline/random.h"
#include "feedline/schema.h"
#include "feedline/stats.h"
#include "feedline/text.h"
#include "feedline/transform.h"

#endif  // FEEDLINE_FEEDLINE_H_
